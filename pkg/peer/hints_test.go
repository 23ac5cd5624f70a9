package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
)

// TestOwnerAsksTheNodeThatFetchedFirst: one node reads a version before
// the other nodes' mounts of it have opened (pods start seconds apart), so
// the owners of most of its chunks refuse and it fetches them from the
// registry itself. When the owners' mounts open and read the version, each
// owner asks that node first for the chunks it refused (a hint recorded
// from the refused request), so the registry sends every chunk once.
// Without the hints an owner fetched them from the registry again.
func TestOwnerAsksTheNodeThatFetchedFirst(t *testing.T) {
	o, descs := version(48, 16<<10)
	nodes := fleet(t, 3, o, descs)
	for _, nd := range nodes[1:] {
		nd.withdraw() // no mount of the version there yet
	}
	read := func(nd *node, f *Fetcher) error {
		view := nd.cache.For(testOrigin)
		for _, d := range descs {
			ch, err := view.Load(context.Background(), f, d)
			if err != nil {
				return err
			}
			b := make([]byte, d.Size)
			_, err = ch.ReadAt(b, 0)
			ch.Close()
			if err != nil && err != io.EOF {
				return err
			}
			if !bytes.Equal(b, o.blobs[d.Digest]) {
				return fmt.Errorf("%s: wrong bytes", d.Digest)
			}
		}
		return nil
	}
	// open is a mount opening on nd: its fetcher, through which the node
	// also fetches for its peers.
	open := func(nd *node) *Fetcher {
		f := NewFetcher(nd.ring, testRegistry, testRepo, o, Options{Scheme: "http", Stats: nd.stats})
		f.OnClose(nd.server.Serve(testOrigin, f.ForPeers(), knows(descs)))
		t.Cleanup(func() { f.Close() })
		return f
	}
	owned := map[string]int{}
	for _, d := range descs {
		owned[nodes[0].ring.Owners(d.Digest)[0]]++
	}
	if owned[nodes[1].ring.Self()] == 0 || owned[nodes[2].ring.Self()] == 0 {
		t.Fatalf("the other nodes own no chunk: %v", owned)
	}
	if err := read(nodes[0], open(nodes[0])); err != nil {
		t.Fatal(err)
	}
	first := len(o.gets)
	for _, nd := range nodes[1:] {
		if err := read(nd, open(nd)); err != nil {
			t.Fatal(err)
		}
	}
	var twice []ocispec.Descriptor
	for _, d := range descs {
		if o.gets[d.Digest] != 1 {
			twice = append(twice, d)
		}
	}
	t.Logf("owned by the late nodes: %d and %d of %d chunks; the first node fetched %d from the registry", owned[nodes[1].ring.Self()], owned[nodes[2].ring.Self()], len(descs), first)
	if len(twice) > 0 {
		t.Errorf("%d of %d chunks left the registry more than once: the late owners did not ask the node that fetched them", len(twice), len(descs))
	}
}

// TestHintsBounded: hints name members only, expire with the member's
// departure, and are bounded.
func TestHintsBounded(t *testing.T) {
	r := NewRing("10.0.0.1:1")
	r.Set([]string{"10.0.0.1:1", "10.0.0.2:1"})
	_, descs := version(3, 1<<10)
	r.Hint(descs[0].Digest, "10.9.9.9:1") // not a member
	r.Hint(descs[1].Digest, "10.0.0.1:1") // itself
	r.Hint(descs[2].Digest, "10.0.0.2:1")
	if r.Hinted(descs[0].Digest) != "" || r.Hinted(descs[1].Digest) != "" || r.Hinted(descs[2].Digest) != "10.0.0.2:1" {
		t.Errorf("hints: %q %q %q", r.Hinted(descs[0].Digest), r.Hinted(descs[1].Digest), r.Hinted(descs[2].Digest))
	}
	r.MarkDown("10.0.0.2:1", 1e9)
	if h := r.Hinted(descs[2].Digest); h != "" {
		t.Errorf("a skipped peer is hinted: %q", h)
	}
	r.Set([]string{"10.0.0.1:1"})
	if h := r.Hinted(descs[2].Digest); h != "" {
		t.Errorf("a departed peer is hinted: %q", h)
	}
	r.Set([]string{"10.0.0.1:1", "10.0.0.2:1"})
	for i := range maxHints + 10 {
		var d [32]byte
		d[0], d[1], d[2] = byte(i), byte(i>>8), byte(i>>16)
		r.Hint(digestOf(d), "10.0.0.2:1")
	}
	if len(r.hints) != maxHints || len(r.hintOrder) != maxHints {
		t.Errorf("%d hints (%d in order), want at most %d", len(r.hints), len(r.hintOrder), maxHints)
	}
}

func digestOf(b [32]byte) digest.Digest { return digest.FromBytes(b[:]) }

// TestFleetStartsApart: the nodes of a fleet told to start together (the
// pulls of a rollout) start up to a few hundred milliseconds apart: one
// node listens late, or has not read the version yet when its peers ask
// it. Within the start window (Ring.AwaitStart, Server.AwaitUntil) its
// peers try it again and it holds their requests, so the registry still
// sends every chunk once. Without the window the nodes fetched the late
// node's chunks themselves, and it fetched them again.
func TestFleetStartsApart(t *testing.T) {
	for _, late := range []string{"listens", "opens"} {
		t.Run(late+" late", func(t *testing.T) {
			o, descs := version(48, 16<<10)
			o.latency = 40 * time.Millisecond // the early nodes still read when the late one comes
			nodes := fleet(t, 3, o, descs)
			until := time.Now().Add(3 * time.Second)
			for _, nd := range nodes {
				nd.ring.AwaitStart(until)
				nd.server.AwaitUntil = until
			}
			last := nodes[2]
			const delay = 400 * time.Millisecond
			switch late {
			case "listens":
				addr := last.http.Listener.Addr().String()
				last.http.Close()
				time.AfterFunc(delay, func() {
					l, err := net.Listen("tcp", addr)
					if err != nil {
						t.Error(err)
						return
					}
					srv := &http.Server{Handler: last.server}
					go srv.Serve(l)
					t.Cleanup(func() { srv.Close() })
				})
			case "opens":
				last.withdraw()
				time.AfterFunc(delay, func() { last.server.Serve(testOrigin, o, knows(descs)) })
			}
			var g errgroup.Group
			for i, nd := range nodes {
				g.Go(func() error {
					if i == 2 {
						time.Sleep(delay)
					}
					return nd.readAll(context.Background(), o, descs)
				})
			}
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
			more := 0
			for _, d := range descs {
				if o.gets[d.Digest] != 1 {
					more++
				}
			}
			if more > 0 {
				t.Errorf("%d of %d chunks left the registry more than once: the nodes did not wait for the late one", more, len(descs))
			}
		})
	}
}
