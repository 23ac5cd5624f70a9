package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
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
	checkFetchedOnce(t, reg.Stats(), "3 nodes", 4)
}

// TestCSIPeersWithdraw: a mounter fetches from the registry, for its peers,
// the chunks it owns of a version only while a pod's mount of it lasts
// (with that pod's credentials): once the mount ends, a peer asking for a
// chunk the node does not hold gets 404, and the registry is not asked.
func TestCSIPeersWithdraw(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	var tree []node
	for i := range 3 {
		tree = append(tree, fileNode("shard-"+string(rune('a'+i))+".bin", 0o644, randBytes(uint64(70+i), 1<<20)))
	}
	buildTree(t, src, tree, time.Time{})
	repo := "team/withdraw"
	ref := reg.Host + "/" + repo
	d := push(t, ref, ref+":v1", src, smallChunks...)
	// A node without the peer tier reads the version: its cache lists the
	// chunks, with their sizes.
	plain := startCSIWith(t, 0, "1GiB", nil)
	p := plain.newPod("lister")
	plain.mustPublish(p, ref+"@"+d, "")
	compareTrees(t, src, p.target)
	// The node under test is alone in its ring: it owns every chunk.
	addr := freeAddr(t)
	n := startCSIWith(t, 0, "1GiB", []string{"--peer-listen", addr, "--peers", addr, "--peer-insecure"})
	q := n.newPod("owner")
	n.mustPublish(q, ref+"@"+d, "")
	held := cacheEntries(t, n.cacheDir) // the version's manifests and index
	var chunks []chunkFile
	for _, c := range cacheEntries(t, plain.cacheDir) {
		if !containsBlob(held, c.digest) {
			chunks = append(chunks, c)
		}
	}
	if len(chunks) < 2 {
		t.Fatalf("only %d chunks the owner does not hold", len(chunks))
	}
	ask := func(c chunkFile) int {
		resp, err := http.Get(fmt.Sprintf("http://%s/v2/%s/blobs/%s?ns=%s&size=%d", addr, repo, c.digest, reg.Host, c.size))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := ask(chunks[0]); code != http.StatusOK {
		t.Fatalf("while the mount lasts, a chunk the owner does not hold: %d, want 200 (fetched for the peer)", code)
	}
	if err := n.unpublish(q); err != nil {
		t.Fatal(err)
	}
	if !n.mounterLog.waitFor(30*time.Second, `"msg":"unmounted"`) {
		t.Fatal("the mount did not end after the pod's unpublish")
	}
	reg.ResetStats()
	if code := ask(chunks[1]); code != http.StatusNotFound {
		t.Errorf("after the mount ended, a chunk the owner does not hold: %d, want 404", code)
	}
	if gets := reg.Stats().BlobGets[chunks[1].digest]; gets != 0 {
		t.Errorf("after the mount ended the owner fetched a chunk for a peer %d times, want 0", gets)
	}
}

// chunkFile is a blob in a chunk cache directory.
type chunkFile struct {
	digest string
	size   int64
}

// cacheEntries lists the blobs in the chunk cache under cacheDir.
func cacheEntries(t *testing.T, cacheDir string) []chunkFile {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(cacheDir, "chunks", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var out []chunkFile
	for _, e := range es {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			out = append(out, chunkFile{"sha256:" + e.Name(), info.Size()})
		}
	}
	return out
}

func containsBlob(bs []chunkFile, d string) bool {
	for _, b := range bs {
		if b.digest == d {
			return true
		}
	}
	return false
}

// TestPullPeers: three `bdnvol pull`s of one version at once, each with
// its own cache directory and peer address, form a ring for their
// duration: every chunk leaves the registry about once (each node
// fetches the chunks it owns, and asks their owners for the rest), and
// every node writes every byte right. Without the peer tier each chunk
// left it three times.
func TestPullPeers(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	var tree []node
	for i := range 6 {
		tree = append(tree, fileNode("shard-"+string(rune('a'+i))+".bin", 0o644, randBytes(uint64(90+i), 1<<20+i*7919)))
	}
	buildTree(t, src, tree, time.Time{})
	ref := reg.Host + "/team/pullfleet"
	d := push(t, ref, ref+":v1", src, smallChunks...)
	tls := peerTLSDir(t)
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	reg.ResetStats()
	var wg sync.WaitGroup
	dirs := make([]string, len(addrs))
	for i, a := range addrs {
		dirs[i] = filepath.Join(t.TempDir(), "out")
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := run(t, "--cache-dir", filepath.Join(t.TempDir(), "cache"), "pull", "--json",
				"--peer-listen", a, "--peers", strings.Join(addrs, ","), "--peer-tls-dir", tls, "--peer-linger", "2s",
				ref+"@"+d, dirs[i])
			if res.code != 0 {
				t.Errorf("pull %d:\n%s", i, res)
			}
			t.Logf("pull %d: %s\n%s", i, strings.TrimSpace(res.stdout), res.stderr)
		}()
	}
	wg.Wait()
	for _, dir := range dirs {
		compareTrees(t, src, dir)
	}
	checkFetchedOnce(t, reg.Stats(), "3 pulls", 4)
}

// TestCSIPeersWarmList: a rollout through the warm list: three mounters,
// each with its own cache and peer address, whose --warm-list names a new
// version, warm it at once through the peer tier: every chunk leaves the
// registry about once (the index blobs, which each node reads itself,
// aside), and each node then has all of it warm. Without the peer tier
// each chunk left it three times.
func TestCSIPeersWarmList(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	var tree []node
	for i := range 6 {
		tree = append(tree, fileNode("shard-"+string(rune('a'+i))+".bin", 0o644, randBytes(uint64(110+i), 1<<20+i*7919)))
	}
	buildTree(t, src, tree, time.Time{})
	repo := reg.Host + "/team/rollout"
	ref := repo + ":v2"
	push(t, repo, ref, src, smallChunks...)
	// The mounters run before the rollout (a DaemonSet); the list then
	// names the new version, and each reads it within a second. Warming
	// paced at 2 MiB/s takes each node about 3 s: they warm together.
	list := filepath.Join(t.TempDir(), "warm-list")
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	var nodes []*csiNode
	for _, a := range addrs {
		nodes = append(nodes, startCSIWith(t, time.Minute, "1GiB",
			[]string{"--warm-list", list, "--warm-resolve-interval", "1s", "--warm-bandwidth", "2MiB",
				"--peer-listen", a, "--peers", strings.Join(addrs, ","), "--peer-insecure"}))
	}
	reg.ResetStats()
	mustWrite(t, list, []byte(ref+"\n"))
	for _, n := range nodes {
		n.waitWarm("rollout", func(s warmStatus) bool { st, _ := s.entry(ref); return st == "warm" })
	}
	// The nodes read the list up to a second apart: a few chunks a node
	// owns are fetched before it warms.
	st := reg.Stats()
	checkFetchedOnce(t, st, "3 nodes warming", len(st.BlobGets)/8)
}

// checkFetchedOnce checks that the registry sent each blob of a version
// read by several nodes at once about once: at least 20 blobs once (enough
// chunks to show anything) and at most maxMore more than once (4: the index
// blobs, which each node reads itself). who names the nodes in the
// messages.
func checkFetchedOnce(t *testing.T, st stats, who string, maxMore int) {
	t.Helper()
	var once, more int
	for dg, n := range st.BlobGets {
		if n == 1 {
			once++
		} else {
			more++
			t.Logf("%s: %d GETs", dg, n)
		}
	}
	t.Logf("%s: %d blob GETs of %d digests, %d fetched once, %d more than once; %d blob bytes", who, total(st.BlobGets), len(st.BlobGets), once, more, st.BlobBytesOut)
	if once < 20 {
		t.Fatalf("only %d blobs fetched once: the version has too few chunks to show anything", once)
	}
	if more > maxMore {
		t.Errorf("%s: %d blobs left the registry more than once: the nodes did not share them", who, more)
	}
}
