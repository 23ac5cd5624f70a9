package warmstate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// targets are the stores a companion must work in: a registry serving the
// referrers API, one that answers 404 to it (the tag schema then), and an
// OCI layout.
var targets = []string{"referrers", "tag-schema", "layout"}

func openTarget(t *testing.T, kind string) oci.Target {
	t.Helper()
	return openRef(t, targetRef(t, kind))
}

// targetRef starts a store of kind and returns its reference.
func targetRef(t *testing.T, kind string) oci.Ref {
	t.Helper()
	var ref oci.Ref
	var err error
	if kind == "layout" {
		ref, err = oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "repo"))
	} else {
		srv := httptest.NewServer(ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(kind == "referrers")))
		t.Cleanup(srv.Close)
		ref, err = oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/models/m")
	}
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// openRef opens ref as a client of its own, as another process would.
func openRef(t *testing.T, ref oci.Ref) oci.Target {
	t.Helper()
	tg, err := oci.Open(context.Background(), ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// pushTree seals files as a version in tg and returns its root.
func pushTree(t *testing.T, tg oci.Target, files map[string][]byte) (ocispec.Descriptor, *push.Result) {
	t.Helper()
	dir := t.TempDir()
	testutil.WriteTree(t, dir, files)
	r, err := push.Push(context.Background(), tg, push.DirSource(dir), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Root, r
}

func cacheTree(t *testing.T, seed string) string {
	dir := t.TempDir()
	files := map[string][]byte{}
	for i := range 20 {
		files[fmt.Sprintf("abc123/rank_0_0/inductor_cache/k%02d.py", i)] = []byte(seed + fmt.Sprint(i))
	}
	files["abc123/rank_0_0/big.so"] = testutil.RandBytes(7, 3<<20)
	testutil.WriteTree(t, dir, files)
	return dir
}

func mustKey(t *testing.T, s string) Key {
	t.Helper()
	k, err := ParseKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const fullKey = "engine=vllm,engine-image=sha256:1111111111111111111111111111111111111111111111111111111111111111," +
	"gpu=NVIDIA-H100-80GB-HBM3,cc=9.0,driver=550,tp=2,pp=1,dp=1,ep=1,rank=0,dtype=bf16,quant=fp8,compile-hash=abc123,site=x"

// Keys are canonical: field order, case of names, "_" in names, leading
// zeros and the case of engine/dtype/quant do not change a key; malformed
// fields are refused with the field named.
func TestParseKey(t *testing.T) {
	a := mustKey(t, "TP=02,engine=VLLM,Compile_Hash=abc, dtype=BF16 ,cc=09.0")
	b := mustKey(t, "cc=9.0,compile-hash=abc,dtype=bf16,engine=vllm,tp=2")
	if a.String() != b.String() || !a.Equal(b) || a.Hash() != b.Hash() {
		t.Fatalf("%s != %s", a, b)
	}
	if got, want := b.String(), "cc=9.0,compile-hash=abc,dtype=bf16,engine=vllm,tp=2"; got != want {
		t.Fatalf("canonical %q, want %q", got, want)
	}
	for _, bad := range []string{"", "tp=2", "engine=vllm,engine=x", "engine=vllm,tp=two", "engine=vllm,cc=9",
		"engine=vllm,engine-image=latest", "engine=vllm,x", "engine=vllm,gpu=", "engine=vllm,gpu=a\nb", "engine=vllm,Ünï=1"} {
		if _, err := ParseKey(bad); !errors.Is(err, ErrBadKey) {
			t.Errorf("%q: %v, want ErrBadKey", bad, err)
		}
	}
}

// A reader gets the companion whose key equals its own, every field, and
// nothing for a key that differs in any one field, or has one field more
// or less. The companion's tree dedups against the companion before it.
func TestFindExactKey(t *testing.T) {
	for _, kind := range targets {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			tg := openTarget(t, kind)
			v, _ := pushTree(t, tg, map[string][]byte{"model.safetensors": testutil.RandBytes(1, 1<<20)})
			key := mustKey(t, fullKey)
			p, err := Publish(ctx, tg, v, key, push.DirSource(cacheTree(t, "a")), PublishOptions{Holder: "pod-a"})
			if err != nil {
				t.Fatal(err)
			}
			if p.Existed || p.Lost || p.Push == nil {
				t.Fatalf("first publish: %+v", p)
			}
			c, err := Find(ctx, tg, v, mustKey(t, fullKey), signature.Policy{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Desc.Digest != p.Companion.Desc.Digest || c.Tree.Digest != p.Push.Root.Digest {
				t.Fatalf("found %s (tree %s), published %s (tree %s)", c.Desc.Digest, c.Tree.Digest, p.Companion.Desc.Digest, p.Push.Root.Digest)
			}
			for name := range key {
				other := Key{}
				for n, val := range key {
					other[n] = val
				}
				switch name {
				case FieldEngineImage:
					other[name] = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
				case FieldCC:
					other[name] = "8.0"
				case FieldDriver, FieldTP, FieldPP, FieldDP, FieldEP, FieldRank:
					other[name] = "7"
				default:
					other[name] = key[name] + "x"
				}
				if _, err := Find(ctx, tg, v, other, signature.Policy{}); !errors.Is(err, ErrNotFound) {
					t.Errorf("%s changed: %v, want ErrNotFound", name, err)
				}
				if name == FieldEngine {
					continue
				}
				delete(other, name)
				if _, err := Find(ctx, tg, v, other, signature.Policy{}); !errors.Is(err, ErrNotFound) {
					t.Errorf("%s left out: %v, want ErrNotFound", name, err)
				}
			}
			more := mustKey(t, fullKey+",extra=1")
			if _, err := Find(ctx, tg, v, more, signature.Policy{}); !errors.Is(err, ErrNotFound) {
				t.Errorf("a field more: %v, want ErrNotFound", err)
			}
			// Another rank's cache, mostly the same bytes: only what differs is uploaded.
			r1 := mustKey(t, strings.Replace(fullKey, "rank=0", "rank=1", 1))
			p1, err := Publish(ctx, tg, v, r1, push.DirSource(cacheTree(t, "b")), PublishOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p1.Push.BytesUploaded >= 1<<20 {
				t.Errorf("rank 1 uploaded %d bytes; its 3 MiB file is rank 0's", p1.Push.BytesUploaded)
			}
			cs, err := List(ctx, tg, v)
			if err != nil || len(cs) != 2 {
				t.Fatalf("List: %v, %d companions", err, len(cs))
			}
			// Publishing a key again changes nothing.
			again, err := Publish(ctx, tg, v, key, push.DirSource(cacheTree(t, "c")), PublishOptions{})
			if err != nil || !again.Existed || again.Companion.Desc.Digest != p.Companion.Desc.Digest {
				t.Fatalf("again: %+v, %v", again, err)
			}
		})
	}
}

func newSigner(t *testing.T) signature.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := signature.NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Under a policy requiring a signature, a signed companion is found; a
// copy of it whose key annotations were changed after signing (pushed
// again under the same subject) is another digest, unsigned, and refused.
func TestSignedKeyTampered(t *testing.T) {
	for _, kind := range targets {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			tg := openTarget(t, kind)
			v, _ := pushTree(t, tg, map[string][]byte{"w": []byte("weights")})
			s := newSigner(t)
			pol := signature.Policy{Keys: []signature.Verifier{s.Verifier()}}
			key := mustKey(t, "engine=vllm,gpu=A100,tp=1")
			p, err := Publish(ctx, tg, v, key, push.DirSource(cacheTree(t, "a")), PublishOptions{Signer: s, Repo: "models/m"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Find(ctx, tg, v, key, pol); err != nil {
				t.Fatalf("signed companion: %v", err)
			}
			// Tamper: the same index with its key changed to another GPU's.
			b, err := content.FetchAll(ctx, tg, p.Companion.Desc)
			if err != nil {
				t.Fatal(err)
			}
			var idx map[string]any
			if err := json.Unmarshal(b, &idx); err != nil {
				t.Fatal(err)
			}
			ann := idx["annotations"].(map[string]any)
			ann[AnnotationKey] = "engine=vllm,gpu=H100,tp=1"
			ann[AnnotationFieldPrefix+"gpu"] = "H100"
			nb, _ := json.Marshal(idx)
			nd := content.NewDescriptorFromBytes(ocispec.MediaTypeImageIndex, nb)
			nd.ArtifactType = ArtifactType
			if err := tg.Push(ctx, nd, strings.NewReader(string(nb))); err != nil {
				t.Fatal(err)
			}
			h100 := mustKey(t, "engine=vllm,gpu=H100,tp=1")
			if c, err := Find(ctx, tg, v, h100, signature.Policy{}); err != nil || c.Desc.Digest != nd.Digest {
				t.Fatalf("without a policy the tampered copy is listed: %v", err)
			}
			if _, err := Find(ctx, tg, v, h100, pol); !errors.Is(err, signature.ErrRefused) {
				t.Fatalf("tampered key under the policy: %v, want ErrRefused", err)
			}
			// A field annotation disagreeing with the key makes it invalid.
			ann[AnnotationFieldPrefix+"gpu"] = "A100"
			nb, _ = json.Marshal(idx)
			nd = content.NewDescriptorFromBytes(ocispec.MediaTypeImageIndex, nb)
			if _, err := Decode(nd, nb, v.Digest); !errors.Is(err, ErrInvalid) {
				t.Fatalf("disagreeing annotation: %v", err)
			}
		})
	}
}

// Two publishers of one key at once (different bytes: compiles are not
// deterministic) leave one companion, and both report it or the lease.
func TestPublishRace(t *testing.T) {
	for _, kind := range targets {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			tg := openTarget(t, kind)
			v, _ := pushTree(t, tg, map[string][]byte{"w": []byte("weights")})
			for round := range 4 {
				rk := mustKey(t, fmt.Sprintf("engine=vllm,tp=1,rank=0,round=%d", round))
				var wg sync.WaitGroup
				res := make([]*Published, 2)
				errs := make([]error, 2)
				dirs := []string{cacheTree(t, fmt.Sprint("a", round)), cacheTree(t, fmt.Sprint("b", round))}
				for i := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res[i], errs[i] = Publish(ctx, tg, v, rk, push.DirSource(dirs[i]), PublishOptions{Holder: fmt.Sprint("pod-", i)})
					}()
				}
				wg.Wait()
				var got []string
				for i := range 2 {
					switch {
					case errors.Is(errs[i], ErrLeased):
					case errs[i] != nil:
						t.Fatalf("round %d publisher %d: %v", round, i, errs[i])
					default:
						got = append(got, res[i].Companion.Desc.Digest.String())
					}
				}
				cs, err := List(ctx, tg, v)
				if err != nil {
					t.Fatal(err)
				}
				ms := Matches(cs, rk)
				if len(ms) != 1 {
					t.Fatalf("round %d: %d companions of the key", round, len(ms))
				}
				// The one kept has the lowest digest of those pushed; a
				// publisher that settled before the other pushed may report
				// its own, since deleted.
				for i := range 2 {
					if errs[i] == nil && res[i].Push != nil && res[i].Companion.Desc.Digest < ms[0].Desc.Digest {
						t.Fatalf("round %d: kept %s, not the lowest (%s)", round, ms[0].Desc.Digest, res[i].Companion.Desc.Digest)
					}
				}
				if c, err := Find(ctx, tg, v, rk, signature.Policy{}); err != nil || c.Desc.Digest != ms[0].Desc.Digest {
					t.Fatalf("round %d: Find: %v", round, err)
				}
				_ = got
			}
		})
	}
}

// A lease another publisher holds stops a publish before anything is
// pushed; an expired one does not.
func TestLease(t *testing.T) {
	ctx := context.Background()
	tg := openTarget(t, "tag-schema")
	v, _ := pushTree(t, tg, map[string][]byte{"w": []byte("weights")})
	key := mustKey(t, "engine=vllm")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := takeLease(ctx, tg, v, key, "pod-a", t0, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err := Publish(ctx, tg, v, key, push.DirSource(cacheTree(t, "b")), PublishOptions{Holder: "pod-b", Now: func() time.Time { return t0.Add(time.Second) }})
	if !errors.Is(err, ErrLeased) || !strings.Contains(err.Error(), "pod-a") {
		t.Fatalf("leased: %v", err)
	}
	if cs, _ := List(ctx, tg, v); len(cs) != 0 {
		t.Fatalf("%d companions pushed under another's lease", len(cs))
	}
	p, err := Publish(ctx, tg, v, key, push.DirSource(cacheTree(t, "b")), PublishOptions{Holder: "pod-b", Now: func() time.Time { return t0.Add(2 * time.Minute) }})
	if err != nil || p.Push == nil {
		t.Fatalf("expired lease: %+v %v", p, err)
	}
	if _, held, err := readLease(ctx, tg, LeaseTag(v, key)); err != nil || held {
		t.Fatalf("lease not released: %v", err)
	}
}

// Delete removes a companion and its signatures; the version stays.
func TestDelete(t *testing.T) {
	ctx := context.Background()
	tg := openTarget(t, "layout")
	v, _ := pushTree(t, tg, map[string][]byte{"w": []byte("weights")})
	s := newSigner(t)
	p, err := Publish(ctx, tg, v, mustKey(t, "engine=vllm"), push.DirSource(cacheTree(t, "a")), PublishOptions{Signer: s, Repo: "models/m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, tg, p.Companion.Desc); err != nil {
		t.Fatal(err)
	}
	if cs, err := List(ctx, tg, v); err != nil || len(cs) != 0 {
		t.Fatalf("after Delete: %v, %d", err, len(cs))
	}
	if _, err := tg.Resolve(ctx, signature.Tag(p.Companion.Desc.Digest)); !errors.Is(err, oci.ErrNotFound) {
		t.Fatalf("signature left: %v", err)
	}
	if _, err := layout.Open(ctx, tg, v); err != nil {
		t.Fatalf("version: %v", err)
	}
}

// A publisher told which companions count (a policy) but signing nothing
// itself still keeps its own companion.
func TestPublishUnsignedUnderPolicy(t *testing.T) {
	ctx := context.Background()
	tg := openTarget(t, "layout")
	v, _ := pushTree(t, tg, map[string][]byte{"w": []byte("weights")})
	pol := signature.Policy{Keys: []signature.Verifier{newSigner(t).Verifier()}}
	p, err := Publish(ctx, tg, v, mustKey(t, "engine=vllm"), push.DirSource(cacheTree(t, "a")), PublishOptions{Policy: pol})
	if err != nil || p.Lost || p.Push == nil {
		t.Fatalf("%+v, %v", p, err)
	}
	if cs, _ := List(ctx, tg, v); len(cs) != 1 {
		t.Fatalf("%d companions", len(cs))
	}
}

// A node's fields fill the key's missing ones; a field the key has with
// another value than the node's is refused.
func TestComplete(t *testing.T) {
	node, err := NodeFields([]string{"gpu=NVIDIA-H100-80GB-HBM3", "cc=9.0", "driver=550"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := mustKey(t, "engine=vllm,tp=2").Complete(node)
	if err != nil || k.String() != "cc=9.0,driver=550,engine=vllm,gpu=NVIDIA-H100-80GB-HBM3,tp=2" {
		t.Fatalf("%s, %v", k, err)
	}
	if _, err := mustKey(t, "engine=vllm,driver=560").Complete(node); !errors.Is(err, ErrBadKey) {
		t.Fatalf("other driver: %v", err)
	}
	if k, err := mustKey(t, "engine=vllm,driver=550").Complete(node); err != nil || len(k) != 4 {
		t.Fatalf("same driver: %s, %v", k, err)
	}
}

// nvidia-smi's CSV (a stand-in script printing what the real one prints
// for two H100s) gives the node's fields; GPUs that differ are refused.
func TestNvidiaSMI(t *testing.T) {
	dir := t.TempDir()
	fake := func(out string) string {
		p := filepath.Join(dir, "nvidia-smi")
		script := "#!/bin/sh\ncase \"$*\" in *--query-gpu=name,compute_cap,driver_version*--format=csv,noheader*) printf '" + out + "';; *) exit 2;; esac\n"
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k, err := NvidiaSMI(context.Background(), fake(`NVIDIA H100 80GB HBM3, 9.0, 550.54.15\nNVIDIA H100 80GB HBM3, 9.0, 550.54.15\n`))
	if err != nil || k.String() != "cc=9.0,driver=550,gpu=NVIDIA-H100-80GB-HBM3" {
		t.Fatalf("%s, %v", k, err)
	}
	if _, err := NvidiaSMI(context.Background(), fake(`NVIDIA H100 80GB HBM3, 9.0, 550.54.15\nNVIDIA A100-SXM4-40GB, 8.0, 550.54.15\n`)); err == nil {
		t.Fatal("mixed GPUs accepted")
	}
}

// Publishers of different keys of one version at once (the ranks of one
// start, each its own client) each find their companion listed afterwards,
// also under the referrers tag schema, where each rewrites the one
// referrers index and two at once can each write one that lacks the
// other's companion.
func TestPublishKeysAtOnceAllListed(t *testing.T) {
	for _, kind := range targets {
		if kind == "layout" {
			continue // one process's store: its writes are serialised
		}
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			ref := targetRef(t, kind)
			tg := openRef(t, ref)
			v, _ := pushTree(t, tg, map[string][]byte{"w": []byte("weights")})
			const ranks = 6
			for round := range 3 {
				keys := make([]Key, ranks)
				dirs := make([]string, ranks)
				for i := range ranks {
					keys[i] = mustKey(t, fmt.Sprintf("engine=vllm,tp=%d,rank=%d,round=%d", ranks, i, round))
					dirs[i] = cacheTree(t, fmt.Sprint("r", round, "-", i))
				}
				var wg sync.WaitGroup
				errs := make([]error, ranks)
				for i := range ranks {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, errs[i] = Publish(ctx, openRef(t, ref), v, keys[i], push.DirSource(dirs[i]), PublishOptions{Holder: fmt.Sprint("pod-", i)})
					}()
				}
				wg.Wait()
				cs, err := List(ctx, tg, v)
				if err != nil {
					t.Fatal(err)
				}
				for i := range ranks {
					if errs[i] != nil {
						t.Fatalf("round %d rank %d: %v", round, i, errs[i])
					}
					if n := len(Matches(cs, keys[i])); n != 1 {
						t.Errorf("round %d rank %d: %d companions of its key listed, want 1", round, i, n)
					}
				}
			}
		})
	}
}
