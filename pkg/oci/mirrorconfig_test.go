package oci

import (
	"errors"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestMirrorConfig(t *testing.T) {
	if err := (MirrorConfig{URLs: []string{"not a url"}}).Check(); err == nil {
		t.Error("Check accepted a malformed mirror URL")
	}
	if err := (MirrorConfig{URLs: []string{"https://mirror.example"}}).Check(); err != nil {
		t.Errorf("Check: %v", err)
	}
	ref, err := ParseRef("oci:/tmp/layout:v1")
	if err != nil {
		t.Fatal(err)
	}
	// A local layout has no mirrors: the source comes back as it is.
	f, mf, err := (MirrorConfig{URLs: []string{"https://mirror.example"}}).Fetcher(ref, nil)
	if err != nil || f != nil || mf != nil {
		t.Errorf("Fetcher for a layout = %v, %v, %v; want the source unchanged", f, mf, err)
	}
	reg, _ := ParseRef("r.example/x:v1")
	_, mf, err = (MirrorConfig{URLs: []string{"https://mirror.example"}, HostsDir: "none"}).Fetcher(reg, nil)
	if err != nil || mf == nil {
		t.Errorf("Fetcher with a mirror = %v, %v; want a mirror fetcher", mf, err)
	}
}

func TestOncePerMirror(t *testing.T) {
	var told []string
	f := OncePerMirror(func(m string, err error) { told = append(told, m+": "+err.Error()) })
	for _, m := range []string{"a", "b", "a", "a", "b"} {
		f(m, ocispec.Descriptor{}, errors.New("down"))
	}
	if len(told) != 2 || told[0] != "a: down" || told[1] != "b: down" {
		t.Errorf("told %q", told)
	}
}
