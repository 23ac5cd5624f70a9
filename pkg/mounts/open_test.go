package mounts

import (
	"context"
	"testing"
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
	// The work runs against a volume: headers of a volume without
	// safetensors files is nothing to do.
	v, _ := testVolume(t)
	f, _ := Prefetcher("all")
	if err := f(context.Background(), v); err != nil {
		t.Errorf("prefetch all: %v", err)
	}
}
