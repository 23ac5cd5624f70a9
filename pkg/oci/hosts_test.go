package oci

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseHostsConfig(t *testing.T) {
	const file = `
# containerd registry host namespace configuration
server = "https://registry.example.com"   # upstream

[host."https://spegel.local:5000"]
  capabilities = ["pull", "resolve"]
  skip_verify = true

[host."http://push-only.local"]
  capabilities = [
    "push", # not for reads
  ]

[host."https://dragonfly.local/base"]
  override_path = true
  ca = ["/etc/a.pem", '/etc/b.pem']
  [host."https://dragonfly.local/base".header]
    x-custom = ["1"]

[[plugins]]
  server = "ignored"
`
	c, err := ParseHostsConfig([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	want := &HostsConfig{Server: "https://registry.example.com", Hosts: []HostEntry{
		{URL: "https://spegel.local:5000", Capabilities: []string{"pull", "resolve"}, SkipVerify: true},
		{URL: "http://push-only.local", Capabilities: []string{"push"}},
		{URL: "https://dragonfly.local/base", OverridePath: true, CA: []string{"/etc/a.pem", "/etc/b.pem"}},
	}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", c, want)
	}
	var urls []string
	for _, h := range c.Mirrors("registry.example.com") {
		urls = append(urls, h.URL)
	}
	if want := []string{"https://spegel.local:5000", "https://dragonfly.local/base"}; !reflect.DeepEqual(urls, want) {
		t.Errorf("mirrors %q, want %q (pull hosts only, server is the registry itself)", urls, want)
	}
	urls = urls[:0]
	for _, h := range c.Mirrors("other.example.com") {
		urls = append(urls, h.URL)
	}
	if len(urls) != 3 || urls[2] != "https://registry.example.com" {
		t.Errorf("mirrors for another registry %q: the server goes last", urls)
	}

	for _, bad := range []string{`server = `, `[host."x"`, `server = "unterminated`, `capabilities`, `[host."h"]` + "\n" + `skip_verify = "yes"`, `[host.""]`} {
		if _, err := ParseHostsConfig([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestLoadHostsConfig(t *testing.T) {
	dir := t.TempDir()
	if c, err := LoadHostsConfig(dir, "reg.example.com"); c != nil || err != nil {
		t.Fatalf("no file: %v, %v", c, err)
	}
	write := func(name, s string) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "hosts.toml"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("_default", `[host."https://default.mirror"]`)
	write("reg.example.com:5000", `[host."https://reg.mirror"]`)
	for reg, want := range map[string]string{"reg.example.com:5000": "https://reg.mirror", "other": "https://default.mirror"} {
		c, err := LoadHostsConfig(dir, reg)
		if err != nil || c == nil || len(c.Hosts) != 1 || c.Hosts[0].URL != want {
			t.Errorf("%s: %+v, %v; want %s", reg, c, err, want)
		}
	}
}

func TestHostMirrorCA(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, h := range []HostEntry{
		{URL: "https://m.example", CA: []string{filepath.Join(dir, "missing.pem")}},
		{URL: "https://m.example", CA: []string{notPEM}},
	} {
		_, err := h.Mirror(0)
		if !errors.Is(err, ErrHostsConfig) || !strings.Contains(err.Error(), "https://m.example") {
			t.Errorf("CA %v: %v; want an ErrHostsConfig naming the host", h.CA, err)
		}
	}
	m, err := HostEntry{URL: "https://m.example"}.Mirror(0)
	if err != nil || m.Client != nil {
		t.Errorf("a host without TLS settings: client %v, %v; want the shared default (nil)", m.Client, err)
	}
	m, err = HostEntry{URL: "https://m.example", SkipVerify: true}.Mirror(0)
	if err != nil || m.Client == nil || !m.Client.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify {
		t.Errorf("skip_verify: client %v, %v", m.Client, err)
	}
}
