package oci

import (
	"errors"
	"testing"
	"time"
)

func TestParseRef(t *testing.T) {
	d := "sha256:" + "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	cases := []struct {
		in                     string
		repo, tag, dig, layout string
	}{
		{"reg.example.com/llama:v3", "reg.example.com/llama", "v3", "", ""},
		{"localhost:5000/team/llama:prod", "localhost:5000/team/llama", "prod", "", ""},
		{"reg.example.com/llama@" + d, "reg.example.com/llama", "", d, ""},
		{"reg.example.com/llama:v3@" + d, "reg.example.com/llama", "v3", d, ""},
		{"reg.example.com/llama", "reg.example.com/llama", "", "", ""},
		{"oci:/tmp/vols:v1", "oci:/tmp/vols", "v1", "", "/tmp/vols"},
		{"oci:/tmp/vols@" + d, "oci:/tmp/vols", "", d, "/tmp/vols"},
		{"oci:/tmp/vols", "oci:/tmp/vols", "", "", "/tmp/vols"},
	}
	for _, c := range cases {
		r, err := ParseRef(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if r.Repo() != c.repo || r.Tag != c.tag || r.Digest.String() != c.dig || r.Layout != c.layout {
			t.Errorf("%s: got repo %q tag %q digest %q layout %q", c.in, r.Repo(), r.Tag, r.Digest, r.Layout)
		}
		if r.String() != c.in {
			t.Errorf("%s: String() = %q", c.in, r.String())
		}
	}
	for _, bad := range []string{"llama", "reg.example.com/", "reg.example.com/Llama:v1", "reg/x:bad tag", "reg/x@sha256:zz", "oci:"} {
		if _, err := ParseRef(bad); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("%q: got %v, want ErrInvalidRef", bad, err)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for h, want := range map[string]bool{"localhost:5000": true, "127.0.0.1": true, "127.1.2.3:80": true, "[::1]:5000": true, "reg.example.com": false, "10.0.0.1:5000": false} {
		if IsLoopback(h) != want {
			t.Errorf("%s: want %v", h, want)
		}
	}
}

func TestProtectiveTag(t *testing.T) {
	d := "sha256:" + "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	r, _ := ParseRef("x.io/y@" + d)
	tag := ProtectiveTag(r.Digest, mustTime("2026-11-29T16:00:00Z"))
	if tag != "sealed-20261129T160000.000Z-a1b2c3d4e5f6" {
		t.Fatal(tag)
	}
	ts, hex, ok := ParseProtectiveTag(tag)
	if !ok || hex != "a1b2c3d4e5f6" || ts.Hour() != 16 {
		t.Fatal(ts, hex, ok)
	}
}

func mustTime(s string) (t time.Time) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}
