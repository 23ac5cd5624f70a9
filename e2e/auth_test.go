package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	"github.com/distribution/distribution/v3/registry/handlers"
	"golang.org/x/crypto/bcrypt"
)

// testCA is a self-signed CA and a server certificate it signed.
type testCA struct {
	File   string // the CA certificate, PEM
	Server tls.Certificate
}

// newTestCA makes a CA (written to a PEM file) and a server certificate for
// localhost, 127.0.0.1, ::1 and ips.
func newTestCA(t testing.TB, ips ...net.IP) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bdnvol e2e CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "bdnvol e2e registry"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, ips...),
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca := testCA{
		File:   filepath.Join(t.TempDir(), "ca.pem"),
		Server: tls.Certificate{Certificate: [][]byte{srvDER, caDER}, PrivateKey: srvKey},
	}
	mustWrite(t, ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	return ca
}

// serverIP is an address of this machine that is not loopback, where the
// CLI uses TLS without --tls, or nil if there is none.
func serverIP(t testing.TB) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.To4()
		}
	}
	return nil
}

// serveTLS serves h with TLS on ip, behind the counting middleware.
func serveTLS(t testing.TB, ip net.IP, cert tls.Certificate, h http.Handler) *registry {
	t.Helper()
	r := &registry{stats: newStats(), corrupt: map[string]bool{}}
	l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewUnstartedServer(r.middleware(h))
	r.srv.Listener.Close()
	r.srv.Listener = l
	r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	r.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the tests make fail on purpose
	r.srv.StartTLS()
	t.Cleanup(r.srv.Close)
	r.URL = r.srv.URL
	r.Host = strings.TrimPrefix(r.URL, "https://")
	return r
}

// authRegistry is a distribution registry served with TLS that wants
// credentials: htpasswd basic auth or bearer tokens from tokenServer.
type authRegistry struct {
	*registry
	CA     testCA
	tokens *tokenServer // nil for htpasswd
}

func newAuthRegistry(t *testing.T, ip net.IP, mode, user, pass string) *authRegistry {
	t.Helper()
	return newAuthRegistryWrapped(t, ip, mode, user, pass, nil)
}

// newAuthRegistryWrapped is newAuthRegistry with wrap (when not nil) put
// in front of the registry, behind the counting middleware.
func newAuthRegistryWrapped(t *testing.T, ip net.IP, mode, user, pass string, wrap func(http.Handler) http.Handler) *authRegistry {
	t.Helper()
	ca := newTestCA(t, ip)
	cfg := distributionConfig(t.TempDir())
	ar := &authRegistry{CA: ca}
	switch mode {
	case "htpasswd":
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "htpasswd")
		mustWrite(t, file, []byte(user+":"+string(hash)+"\n"))
		cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "bdnvol-e2e", "path": file}}
	case "token":
		ar.tokens = newTokenServer(t, ip, ca, user, pass)
		cfg.Auth = configuration.Auth{"token": configuration.Parameters{
			"realm":          ar.tokens.URL + "/token",
			"service":        tokenService,
			"issuer":         tokenIssuer,
			"rootcertbundle": ar.tokens.certFile,
		}}
	default:
		t.Fatalf("bad auth mode %q", mode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var h http.Handler = handlers.NewApp(ctx, cfg)
	if wrap != nil {
		h = wrap(h)
	}
	ar.registry = serveTLS(t, ip, ca.Server, h)
	return ar
}

const (
	tokenService = "bdnvol-e2e-registry"
	tokenIssuer  = "bdnvol-e2e-token-issuer"
)

// tokenServer issues ES256 JSON web tokens for the docker token protocol
// (GET with basic auth, or the OAuth2 password grant by POST), granting
// whatever is asked to the one user with the right password.
type tokenServer struct {
	URL      string
	certFile string // the signing certificate, the registry's rootcertbundle
	key      *ecdsa.PrivateKey
	certDER  []byte
	user     string
	pass     string

	mu     sync.Mutex
	issued []string
}

func newTokenServer(t *testing.T, ip net.IP, ca testCA, user, pass string) *tokenServer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(3),
		Subject:               pkix.Name{CommonName: tokenIssuer},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ts := &tokenServer{key: key, certDER: der, user: user, pass: pass, certFile: filepath.Join(t.TempDir(), "token-signer.pem")}
	mustWrite(t, ts.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	srv := serveTLS(t, ip, ca.Server, http.HandlerFunc(ts.serve))
	ts.URL = srv.URL
	return ts
}

// Issued returns every token handed out.
func (ts *tokenServer) Issued() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.issued...)
}

func (ts *tokenServer) serve(w http.ResponseWriter, r *http.Request) {
	var user, pass string
	var scopes []string
	switch r.Method {
	case http.MethodGet:
		user, pass, _ = r.BasicAuth()
		scopes = r.URL.Query()["scope"]
	case http.MethodPost:
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.PostForm.Get("grant_type") != "password" {
			http.Error(w, `{"error":"unsupported_grant_type"}`, http.StatusBadRequest)
			return
		}
		user, pass = r.PostForm.Get("username"), r.PostForm.Get("password")
		scopes = strings.Fields(r.PostForm.Get("scope"))
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if user != ts.user || pass != ts.pass {
		w.Header().Set("WWW-Authenticate", `Basic realm="bdnvol-e2e-token"`)
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}`, http.StatusUnauthorized)
		return
	}
	type access struct {
		Type    string   `json:"type"`
		Name    string   `json:"name"`
		Actions []string `json:"actions"`
	}
	grants := []access{}
	for _, s := range scopes {
		for _, one := range strings.Fields(s) {
			parts := strings.Split(one, ":")
			if len(parts) != 3 {
				continue
			}
			grants = append(grants, access{Type: parts[0], Name: parts[1], Actions: strings.Split(parts[2], ",")})
		}
	}
	now := time.Now()
	claims, _ := json.Marshal(map[string]any{
		"iss": tokenIssuer, "sub": user, "aud": tokenService,
		"exp": now.Add(5 * time.Minute).Unix(), "nbf": now.Add(-time.Minute).Unix(), "iat": now.Unix(),
		"jti": hex.EncodeToString(randBytes(uint64(now.UnixNano()), 8)), "access": grants,
	})
	header, _ := json.Marshal(map[string]any{"alg": "ES256", "typ": "JWT", "x5c": []string{base64.StdEncoding.EncodeToString(ts.certDER)}})
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(signing))
	rr, ss, err := ecdsa.Sign(rand.Reader, ts.key, sum[:])
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	sig := make([]byte, 64)
	rr.FillBytes(sig[:32])
	ss.FillBytes(sig[32:])
	tok := signing + "." + enc.EncodeToString(sig)
	ts.mu.Lock()
	ts.issued = append(ts.issued, tok)
	ts.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"token": tok, "access_token": tok, "expires_in": 300, "issued_at": now.UTC().Format(time.RFC3339)})
}

// TestAuthTLS logs in to registries served with TLS by a self-signed CA
// and wanting credentials (htpasswd basic auth, bearer tokens), pushes,
// pulls and mounts with --ca-file or SSL_CERT_FILE; a missing CA and a wrong
// password fail clearly, and the password and tokens never show. The
// htpasswd registry listens on an address that is not loopback where the
// machine has one (TLS by default), the token one on 127.0.0.1 (--tls).
func TestAuthTLS(t *testing.T) {
	for _, mode := range []string{"htpasswd", "token"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ip := serverIP(t)
			if mode == "token" || ip == nil {
				ip = net.IPv4(127, 0, 0, 1)
			}
			testAuthTLS(t, mode, ip)
		})
	}
}

func testAuthTLS(t *testing.T, mode string, ip net.IP) {
	const user = "e2e-user"
	pass := "pw-" + hex.EncodeToString(randBytes(uint64(time.Now().UnixNano()), 12))
	reg := newAuthRegistry(t, ip, mode, user, pass)
	var tlsFlag []string // plain flags for a loopback registry: TLS must be asked for
	if ip.IsLoopback() {
		tlsFlag = []string{"--tls"}
	}
	caFlag := append([]string{"--ca-file", reg.CA.File}, tlsFlag...)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/auth"

	var seen []result
	runRec := func(stdin string, env []string, args ...string) result {
		t.Helper()
		res := runWith(t, stdin, env, args...)
		seen = append(seen, res)
		return res
	}
	mentions := func(res result, what string, words ...string) {
		t.Helper()
		last := checkCleanFailure(t, res)
		lower := strings.ToLower(last)
		if !strings.Contains(last, reg.Host) {
			t.Errorf("%s: the error does not name the registry %s: %q", what, reg.Host, last)
		}
		for _, w := range words {
			if strings.Contains(lower, w) {
				return
			}
		}
		t.Errorf("%s: the error says none of %q: %q", what, words, last)
	}
	tlsWords := []string{"certificate", "x509", "tls"}
	authWords := []string{"401", "unauthorized", "authentication", "credential", "password", "denied"}

	// Without the CA: a TLS error.
	res := runRec(pass+"\n", nil, append(append([]string{"login"}, tlsFlag...), reg.Host, "-u", user, "--password-stdin")...)
	mentions(res, "login without the CA", tlsWords...)
	// A wrong password: exit 1, the registry named, nothing saved.
	res = runRec("wrong-"+pass+"\n", nil, append(append([]string{"login"}, caFlag...), reg.Host, "-u", user, "--password-stdin")...)
	if res.code != 1 {
		t.Errorf("login with a wrong password: exit %d, want 1", res.code)
	}
	mentions(res, "login with a wrong password", authWords...)
	if b, err := os.ReadFile(filepath.Join(home(t), "config.json")); err == nil && strings.Contains(string(b), reg.Host) {
		t.Errorf("a failed login saved credentials:\n%s", b)
	}
	// No credentials: push fails clearly.
	res = runRec("", nil, append(append([]string{"push"}, caFlag...), repo+":v1", src)...)
	mentions(res, "push without logging in", authWords...)

	// Log in, push, pull.
	res = runRec(pass+"\n", nil, append(append([]string{"login"}, caFlag...), reg.Host, "-u", user, "--password-stdin")...)
	if res.code != 0 {
		t.Fatalf("login:\n%s", res)
	}
	res = runRec("", nil, append(append(append([]string{"push", "--json"}, caFlag...), smallChunks...), repo+":v1", src)...)
	if res.code != 0 {
		t.Fatalf("push after login:\n%s", res)
	}
	var pr pushResult
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pr)
	dst := filepath.Join(t.TempDir(), "dst")
	if res = runRec("", nil, append(append([]string{"pull"}, caFlag...), repo+":v1", dst)...); res.code != 0 {
		t.Fatalf("pull --ca-file:\n%s", res)
	}
	compareTrees(t, src, dst)
	dst2 := filepath.Join(t.TempDir(), "dst")
	if res = runRec("", []string{"SSL_CERT_FILE=" + reg.CA.File}, append(append([]string{"pull"}, tlsFlag...), repo+"@"+pr.Digest, dst2)...); res.code != 0 {
		t.Fatalf("pull with SSL_CERT_FILE:\n%s", res)
	}
	compareTrees(t, src, dst2)
	res = runRec("", nil, append(append([]string{"pull"}, tlsFlag...), repo+"@"+pr.Digest, filepath.Join(t.TempDir(), "dst"))...)
	mentions(res, "pull without the CA", tlsWords...)
	if mode == "token" && len(reg.tokens.Issued()) == 0 {
		t.Errorf("the token server issued no token")
	}

	homes := []string{home(t)}
	t.Run("mount", func(t *testing.T) {
		// The mount runs with this subtest's home: give it the credentials.
		mustWrite(t, filepath.Join(home(t), "config.json"), fileContents(t, filepath.Join(homes[0], "config.json")))
		homes = append(homes, home(t))
		mp, res := tryMount(t, repo+":v1", append(caFlag, "--prefetch", "none")...)
		seen = append(seen, res)
		if res.code != 0 {
			t.Fatalf("mount --ca-file:\n%s", res)
		}
		if eio := readThroughMount(t, src, mp); len(eio) > 0 {
			t.Errorf("reading through the mount: EIO on %v", eio)
		}
		forceUnmount(t, mp)
		checkNoSecrets(t, reg, user, pass, seen, homes)
	})
	checkNoSecrets(t, reg, user, pass, seen, homes[:1])
}

// checkNoSecrets fails the test if the password, the docker config's
// encoding of it or a token shows in any output, or in any file under the
// homes other than the docker config login writes.
func checkNoSecrets(t *testing.T, reg *authRegistry, user, pass string, seen []result, homes []string) {
	t.Helper()
	secrets := map[string]string{
		pass: "the password",
		base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)): "base64(user:password)",
	}
	if reg.tokens != nil {
		for i, tok := range reg.tokens.Issued() {
			secrets[tok] = "token " + strconv.Itoa(i)
			// The signature alone is a secret too.
			secrets[tok[strings.LastIndex(tok, ".")+1:]] = "the signature of token " + strconv.Itoa(i)
		}
	}
	for _, res := range seen {
		for s, what := range secrets {
			if strings.Contains(res.stdout, s) || strings.Contains(res.stderr, s) {
				t.Errorf("%s shows in the output of bdnvol %s", what, strings.Join(res.args, " "))
			}
		}
	}
	for _, h := range homes {
		err := filepath.WalkDir(h, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() || p == filepath.Join(h, "config.json") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for s, what := range secrets {
				if strings.Contains(string(b), s) {
					t.Errorf("%s is in %s", what, p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
