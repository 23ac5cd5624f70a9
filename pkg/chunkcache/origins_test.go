package chunkcache

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

// emptyFetcher is a registry that holds none of the blobs asked for (an
// attacker's, which only serves a manifest naming another's digests).
func emptyFetcher() *fakeFetcher {
	return &fakeFetcher{src: memory.New(), fetches: map[digest.Digest]int{}}
}

// TestOriginRule: a blob origin A delivered is served to A's views, in this
// process and in a new one, with no fetch; a view of origin B that names the
// same digest is not served it (Load fetches from B, and B holding nothing
// fails; Contains, Has and OpenBacking say no), until B delivers the bytes
// itself; then both are served from the entry. The unscoped cache serves
// every entry.
func TestOriginRule(t *testing.T) {
	ctx := context.Background()
	a, descs, datas := pushChunks(t, 2, 4096)
	dir := t.TempDir()
	c := mustOpenCache(t, dir)
	ca, cb := c.For("reg.example/tenant-a/private"), c.For("evil.example/x")

	for i, d := range descs {
		loadCheck(t, ca, a, d, datas[i])
	}
	a.reset()
	for i, d := range descs {
		loadCheck(t, ca, a, d, datas[i])
	}
	if n, _ := a.total(); n != 0 {
		t.Errorf("origin A read its own cached chunks with %d fetches, want 0", n)
	}

	evil := emptyFetcher()
	for _, d := range descs {
		if cb.Contains(d.Digest) || cb.Has(d.Digest) {
			t.Errorf("a view of another origin reports %s cached", d.Digest)
		}
		ch, err := cb.Load(ctx, evil, d)
		if err == nil {
			b, _ := io.ReadAll(io.NewSectionReader(ch, 0, d.Size))
			ch.Close()
			t.Fatalf("origin B, which holds nothing, was served %d bytes of A's chunk %s", len(b), d.Digest)
		}
		if evil.fetches[d.Digest] != 1 {
			t.Errorf("origin B's load of %s asked its own registry %d times, want 1", d.Digest, evil.fetches[d.Digest])
		}
	}
	if !c.Contains(descs[0].Digest) {
		t.Error("the refused load removed A's entry")
	}

	// A registry that forges: right size, wrong bytes. Refused, and A's
	// entry stays.
	forged := &fakeFetcher{src: a.src, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{descs[0].Digest: true}}
	if _, err := cb.Load(ctx, forged, descs[0]); err == nil {
		t.Fatal("origin B's forged bytes were accepted")
	}

	// B's own registry holds the same chunk: one fetch, then shared.
	b := &fakeFetcher{src: a.src, fetches: map[digest.Digest]int{}}
	loadCheck(t, cb, b, descs[0], datas[0])
	loadCheck(t, cb, b, descs[0], datas[0])
	if n, _ := b.total(); n != 1 {
		t.Errorf("origin B fetched its chunk %d times, want 1 then served from the cache", n)
	}

	// A new process finds both origins recorded with the entry.
	c2 := mustOpenCache(t, dir)
	a.reset()
	b.reset()
	loadCheck(t, c2.For("reg.example/tenant-a/private"), a, descs[0], datas[0])
	loadCheck(t, c2.For("evil.example/x"), b, descs[0], datas[0])
	if na, _ := a.total(); na != 0 {
		t.Errorf("after a restart origin A fetched %d times, want 0", na)
	}
	if nb, _ := b.total(); nb != 0 {
		t.Errorf("after a restart origin B fetched %d times, want 0", nb)
	}
	if _, err := c2.For("evil.example/x").Load(ctx, emptyFetcher(), descs[1]); err == nil {
		t.Error("after a restart origin B was served A's second chunk, which B never delivered")
	}
	loadCheck(t, c2, emptyFetcher(), descs[1], datas[1]) // unscoped

	// Backing files follow the same rule.
	file, want := fileOf(datas...)
	back, err := ca.Assemble(ctx, file, assembleFrom(ca, a, descs))
	if err != nil {
		t.Fatal(err)
	}
	back.Close()
	if got, err := ca.OpenBacking(file); err != nil || got == nil {
		t.Fatalf("origin A's backing file: %v, %v", got, err)
	} else {
		if !bytes.Equal(readAll(t, got), want) {
			t.Error("origin A's backing file has the wrong bytes")
		}
		got.Close()
	}
	if got, err := cb.OpenBacking(file); got != nil || err != nil {
		t.Errorf("origin B was given A's backing file (%v, %v)", got, err)
		if got != nil {
			got.Close()
		}
	}
	if got, err := cb.Assemble(ctx, file, assembleFrom(cb, emptyFetcher(), descs)); err == nil {
		got.Close()
		t.Error("origin B, which holds the first chunk only, assembled A's file")
	}
	if got, err := ca.OpenBacking(file); err != nil || got == nil {
		t.Errorf("origin B's failed assembly lost A's backing file: %v", err)
	} else {
		got.Close()
	}
}

// TestOriginFlightsApart: a load in flight for one origin is not handed to
// a waiter of another.
func TestOriginFlightsApart(t *testing.T) {
	ctx := context.Background()
	a, descs, datas := pushChunks(t, 1, 4096)
	c := mustOpenCache(t, t.TempDir())
	gate := make(chan struct{})
	started := make(chan struct{})
	slow := gatedFetcher{f: a, gate: gate, started: started}
	done := make(chan error, 1)
	go func() {
		ch, err := c.For("reg.example/a").Load(ctx, slow, descs[0])
		if err == nil {
			ch.Close()
		}
		done <- err
	}()
	<-started
	bDone := make(chan error, 1)
	go func() {
		ch, err := c.For("evil.example/x").Load(ctx, emptyFetcher(), descs[0])
		if err == nil {
			ch.Close()
		}
		bDone <- err
	}()
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err == nil {
		t.Error("a load for origin B joined origin A's fetch and was served its bytes")
	}
	loadCheck(t, c.For("reg.example/a"), emptyFetcher(), descs[0], datas[0])
}

// gatedFetcher holds every fetch until gate closes.
type gatedFetcher struct {
	f       *fakeFetcher
	gate    chan struct{}
	started chan struct{}
}

func (g gatedFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	close(g.started)
	<-g.gate
	return g.f.Fetch(ctx, desc)
}
