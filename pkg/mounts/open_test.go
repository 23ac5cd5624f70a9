package mounts

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/lazy"
)

func TestPrefetcher(t *testing.T) {
	for _, s := range []string{"", "none"} {
		if f, err := Prefetcher(s); err != nil || f != nil {
			t.Errorf("Prefetcher(%q) = %v, %v; want nothing to do", s, f != nil, err)
		}
	}
	for _, s := range []string{"headers", "all", "*.safetensors,config.json"} {
		if f, err := Prefetcher(s); err != nil || f == nil {
			t.Errorf("Prefetcher(%q) = %v, %v; want work", s, f != nil, err)
		}
	}
	if _, err := Prefetcher("[["); err == nil {
		t.Error("Prefetcher accepted a malformed glob")
	}
	// A pod's prefetch attribute is bounded: 257 globs, or one of 1025
	// bytes, are refused before any work.
	var many []string
	for i := range 257 {
		many = append(many, fmt.Sprintf("*.x%d", i))
	}
	if _, err := Prefetcher(strings.Join(many, ",")); err == nil {
		t.Error("Prefetcher accepted 257 globs")
	}
	if _, err := Prefetcher("*" + strings.Repeat("a", 1024)); err == nil {
		t.Error("Prefetcher accepted a glob of 1025 bytes")
	}
	// The work runs against a volume: headers of a volume without
	// safetensors files is nothing to do.
	v, _ := testVolume(t)
	f, _ := Prefetcher("all")
	if err := f(context.Background(), v); err != nil {
		t.Errorf("prefetch all: %v", err)
	}
}

// TestPrefetcherCostlyGlobs: the costliest globs allowed, on a version of
// long names, stop within their work budget (the rest is read on demand)
// instead of taking the shared mounter's CPU for minutes.
func TestPrefetcherCostlyGlobs(t *testing.T) {
	files := map[string]string{}
	for i := range 300 {
		files[fmt.Sprintf("d/%s%03d", strings.Repeat("a", 240), i)] = "x"
	}
	v := testVolumeOf(t, files)
	var globs []string
	for i := range 256 {
		globs = append(globs, "*"+strings.Repeat("a", 1019)+fmt.Sprintf("%04d", i))
	}
	f, err := Prefetcher(strings.Join(globs, ","))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f(context.Background(), v) }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("prefetch of 300 files against 256 globs still matching after 20s")
	}
	if !errors.Is(err, lazy.ErrGlobBudget) {
		t.Errorf("prefetch: %v, want the budget error", err)
	}
	t.Logf("300 files, 256 costly globs: %v", time.Since(start))
}
