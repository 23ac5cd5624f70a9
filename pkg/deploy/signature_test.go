package deploy

import "testing"

func TestRequireSignature(t *testing.T) {
	s, err := Parse([]byte(`requireSignature: keys/release.pub
mounts:
  - source: reg.example/m:v1
    path: /models/a
  - source: reg.example/m:v2
    path: /models/b
    requireSignature: /etc/keys/other.pub
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.SignatureKey(0); got != "keys/release.pub" {
		t.Errorf("mount 0: %q", got)
	}
	if got := s.SignatureKey(1); got != "/etc/keys/other.pub" {
		t.Errorf("mount 1: %q", got)
	}
	s, err = Parse([]byte("mounts:\n  - source: reg.example/m:v1\n    path: /models/a\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.SignatureKey(0); got != "" {
		t.Errorf("no key: %q", got)
	}
}
