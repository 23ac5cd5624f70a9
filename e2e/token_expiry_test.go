package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// expiring answers 401 with a Bearer challenge, as a registry does for an
// expired token, to every request whose token was issued more than maxAge
// ago, and slows blob requests so that a push or pull outlives its token.
type expiring struct {
	next     http.Handler
	maxAge   time.Duration
	delay    time.Duration
	realm    string
	rejected atomic.Int64
}

func (e *expiring) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if iat, ok := issuedAt(tok); ok && time.Since(iat) > e.maxAge {
			e.rejected.Add(1)
			name := strings.TrimPrefix(r.URL.Path, "/v2/")
			for _, kind := range []string{"/blobs/", "/manifests/", "/tags/"} {
				if i := strings.Index(name, kind); i >= 0 {
					name = name[:i]
				}
			}
			actions := "pull"
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				actions = "pull,push"
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service=%q,scope="repository:%s:%s",error="invalid_token"`,
				e.realm, tokenService, name, actions))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":"token expired"}]}`)
			return
		}
	}
	if strings.Contains(r.URL.Path, "/blobs/") {
		time.Sleep(e.delay)
	}
	e.next.ServeHTTP(w, r)
}

// issuedAt reads the iat claim of a JWT (the signature is the registry's
// business).
func issuedAt(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var c struct {
		IAT int64 `json:"iat"`
	}
	if json.Unmarshal(b, &c) != nil || c.IAT == 0 {
		return time.Time{}, false
	}
	return time.Unix(c.IAT, 0), true
}

// TestTokenExpiry pushes, pulls and mounts through a registry whose bearer
// tokens expire after 1.5 s: each command outlives its first token, gets 401
// on a blob request (an upload's PUT, with its body, among them), fetches a
// new token and carries on, with nothing to retry by hand.
func TestTokenExpiry(t *testing.T) {
	const user = "e2e-user"
	pass := "pw-expiry"
	ip := net.IPv4(127, 0, 0, 1)
	exp := &expiring{maxAge: 1500 * time.Millisecond, delay: 50 * time.Millisecond}
	reg := newAuthRegistryWrapped(t, ip, "token", user, pass, func(h http.Handler) http.Handler { exp.next = h; return exp })
	exp.realm = reg.tokens.URL + "/token"
	flags := []string{"--ca-file", reg.CA.File, "--tls"}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, []node{fileNode("weights.bin", 0o644, randBytes(21, 4<<20)), fileNode("config.json", 0o644, []byte(`{"x":1}`))}, time.Time{})
	repo := reg.Host + "/vols/expiry"

	if res := runWith(t, pass+"\n", nil, append(append([]string{"login"}, flags...), reg.Host, "-u", user, "--password-stdin")...); res.code != 0 {
		t.Fatalf("login:\n%s", res)
	}
	// About 64 chunks, 3 uploads at a time, 2 slowed requests each.
	res := runWith(t, "", nil, append(append(append([]string{"push", "--json"}, flags...), smallChunks...), repo+":v1", src)...)
	if res.code != 0 {
		t.Fatalf("push with expiring tokens:\n%s", res)
	}
	pushed := exp.rejected.Load()
	if pushed == 0 {
		t.Fatalf("the push never met an expired token (it took too little time to test anything)")
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if res := runWith(t, "", nil, append(append([]string{"pull", "--jobs", "1"}, flags...), repo+":v1", dst)...); res.code != 0 {
		t.Fatalf("pull with expiring tokens:\n%s", res)
	}
	compareTrees(t, src, dst)
	pulled := exp.rejected.Load() - pushed
	if pulled == 0 {
		t.Fatalf("the pull never met an expired token")
	}
	mp, mres := tryMount(t, repo+":v1", append(flags, "--prefetch", "none")...)
	if mres.code != 0 {
		t.Fatalf("mount:\n%s", mres)
	}
	// One read first, so that the daemon holds a token (the starting
	// process asked for the manifest, index and profile), then one that
	// needs other chunks once that token is stale.
	f, err := os.Open(filepath.Join(mp, "weights.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Read(make([]byte, 4096)); err != nil {
		t.Fatalf("first read through the mount: %v", err)
	}
	f.Close()
	time.Sleep(exp.maxAge + time.Second) // the mount's token is stale now
	before := exp.rejected.Load()
	if eio := readThroughMount(t, src, mp); len(eio) > 0 {
		t.Fatalf("reading through a mount whose token expired: EIO on %v", eio)
	}
	t.Logf("401s for expired tokens: push %d, pull %d, mount %d; tokens issued %d", pushed, pulled, exp.rejected.Load()-before, len(reg.tokens.Issued()))
	if exp.rejected.Load() == before {
		t.Fatalf("the mount's reads never met an expired token")
	}
}
