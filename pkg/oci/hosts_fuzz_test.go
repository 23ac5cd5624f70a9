package oci

import (
	"errors"
	"testing"
)

// FuzzParseHostsConfig parses arbitrary bytes as a hosts.toml (a file any
// node admin, or an image of a node, may hand bdnvol): it must refuse with
// ErrHostsConfig or return hosts that each have a URL and whose mirrors are
// listed without a panic.
func FuzzParseHostsConfig(f *testing.F) {
	for _, s := range []string{
		"server = \"https://registry.example.com\"   # upstream\n[host.\"https://spegel.local:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n",
		"[host.\"http://push-only.local\"]\n  capabilities = [\n    \"push\", # not for reads\n  ]\n",
		"[host.\"https://dragonfly.local/base\"]\n  override_path = true\n  ca = [\"/etc/a.pem\", '/etc/b.pem']\n  [host.\"https://dragonfly.local/base\".header]\n    x-custom = [\"1\"]\n[[plugins]]\n  server = \"ignored\"\n",
		"server = ",
		"[host.\"x\"",
		"capabilities",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseHostsConfig(b)
		if err != nil {
			if !errors.Is(err, ErrHostsConfig) {
				t.Fatalf("error %v does not wrap ErrHostsConfig", err)
			}
			return
		}
		for _, h := range c.Hosts {
			if h.URL == "" {
				t.Fatalf("a host without a URL: %+v", h)
			}
		}
		_ = c.Mirrors("registry.example.com")
	})
}
