package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// peerTLSDir writes a cluster CA and one mounter certificate of it (for
// server and client use) as ca.crt, tls.crt and tls.key, as the chart's
// Secret holds them.
func peerTLSDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bdnvol peers CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "bdnvol mounter"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	mustWrite(t, filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}))
	mustWrite(t, filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	return dir
}

// TestCSIPeers: three nodes (each a real mounter and node plugin with its
// own cache and peer address, mutual TLS between the mounters) publish one
// version at once and read all of it: every chunk leaves the registry once
// (the index blobs, which each node reads itself, aside), and every node
// reads every byte right. Without the peer tier each chunk left it three
// times.
func TestCSIPeers(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	files := map[string][]byte{}
	var tree []node
	for i := range 6 {
		b := randBytes(uint64(40+i), 1<<20+i*7919)
		name := "shard-" + string(rune('a'+i)) + ".bin"
		files[name] = b
		tree = append(tree, fileNode(name, 0o644, b))
	}
	buildTree(t, src, tree, time.Time{})
	ref := reg.Host + "/team/fleet"
	d := push(t, ref, ref+":v1", src, smallChunks...)
	tls := peerTLSDir(t)
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	var nodes []*csiNode
	for _, a := range addrs {
		nodes = append(nodes, startCSIWith(t, time.Minute, "1GiB",
			[]string{"--peer-listen", a, "--peers", strings.Join(addrs, ","), "--peer-tls-dir", tls}))
	}
	reg.ResetStats()
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := n.newPod("fleet-" + string(rune('a'+i)))
			if err := n.publish(p, ref+"@"+d, ""); err != nil {
				t.Errorf("node %d: %v", i, err)
				return
			}
			compareTrees(t, src, p.target)
		}()
	}
	wg.Wait()
	st := reg.Stats()
	var once, more int
	for _, n := range st.BlobGets {
		if n == 1 {
			once++
		} else {
			more++
		}
	}
	t.Logf("3 nodes: %d blob GETs of %d digests, %d fetched once, %d more than once; %d blob bytes", total(st.BlobGets), len(st.BlobGets), once, more, st.BlobBytesOut)
	if once < 20 {
		t.Fatalf("only %d blobs fetched once: the version has too few chunks to show anything", once)
	}
	if more > 4 {
		t.Errorf("%d blobs left the registry more than once (%v): the peers did not share them", more, st.BlobGets)
	}
}
