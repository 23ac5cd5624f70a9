package oci

import (
	"strings"
	"testing"
)

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{
		"reg.example.com/llama:v3",
		"localhost:5000/team/llama:prod@sha256:a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
		"oci:/tmp/vols:v1",
		"oci:rel/path@sha256:a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90",
		"[::1]:5000/x:y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		if r.Layout == "" && (r.Registry == "" || r.Repository == "") {
			t.Fatalf("%q parsed without a registry or repository: %+v", s, r)
		}
		if r.Digest != "" && r.Digest.Validate() != nil {
			t.Fatalf("%q: invalid digest accepted", s)
		}
		// What parses prints back to something that parses the same way.
		r2, err := ParseRef(r.String())
		if err != nil || r2 != r {
			t.Fatalf("%q → %q → %+v, %v", s, r.String(), r2, err)
		}
		if strings.ContainsRune(r.Tag, '/') {
			t.Fatalf("%q: tag %q has a slash", s, r.Tag)
		}
	})
}
