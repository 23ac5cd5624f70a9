package oci

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultHostsDir is containerd's registry configuration directory, read
// for mirrors when it exists.
const DefaultHostsDir = "/etc/containerd/certs.d"

// ErrHostsConfig is wrapped by every error about a malformed hosts.toml.
var ErrHostsConfig = errors.New("hosts.toml")

// HostsConfig is the subset of a containerd hosts.toml that bdnvol reads:
//
//	server = "https://registry.example.com"
//
//	[host."https://mirror.example.com"]
//	  capabilities = ["pull", "resolve"]
//	  skip_verify = false
//	  ca = "/etc/certs/mirror.pem"
//	  override_path = false
//
// Other keys and tables are ignored.
type HostsConfig struct {
	Server string      // the upstream endpoint; empty means the registry itself
	Hosts  []HostEntry // in file order, the order they are tried
}

// HostEntry is one [host."URL"] table.
type HostEntry struct {
	URL          string
	Capabilities []string // empty in the file means pull, resolve and push
	SkipVerify   bool
	CA           []string // PEM files
	OverridePath bool
}

// CanPull reports whether the host may serve content by digest.
func (h HostEntry) CanPull() bool {
	return len(h.Capabilities) == 0 || slices.Contains(h.Capabilities, "pull")
}

// LoadHostsConfig reads the hosts.toml of registry (host[:port]) under dir:
// dir/HOST/hosts.toml, else dir/_default/hosts.toml. A missing file is not
// an error: it returns nil.
func LoadHostsConfig(dir, registry string) (*HostsConfig, error) {
	for _, name := range []string{registry, "_default"} {
		p := filepath.Join(dir, name, "hosts.toml")
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrHostsConfig, err)
		}
		c, err := ParseHostsConfig(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return c, nil
	}
	return nil, nil
}

// ParseHostsConfig parses the subset of TOML a hosts.toml uses: comments,
// [tables] with quoted keys, and key = value with strings, booleans,
// integers and arrays of those (which may span lines).
func ParseHostsConfig(b []byte) (*HostsConfig, error) {
	c := &HostsConfig{}
	var cur *HostEntry // nil outside a [host."…"] table
	inOther := false   // inside a table that is not read
	lines := strings.Split(string(b), "\n")
	for ln := 0; ln < len(lines); ln++ {
		line := strings.TrimSpace(stripComment(lines[ln]))
		if line == "" {
			continue
		}
		lineNo := ln + 1
		if strings.HasPrefix(line, "[") {
			if strings.HasPrefix(line, "[[") {
				cur, inOther = nil, true
				continue
			}
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("%w: line %d: bad table header", ErrHostsConfig, lineNo)
			}
			keys, err := splitKey(strings.TrimSpace(line[1 : len(line)-1]))
			if err != nil {
				return nil, fmt.Errorf("%w: line %d: %v", ErrHostsConfig, lineNo, err)
			}
			cur, inOther = nil, true
			if len(keys) == 2 && keys[0] == "host" {
				if keys[1] == "" {
					return nil, fmt.Errorf("%w: line %d: a host table without a URL", ErrHostsConfig, lineNo)
				}
				c.Hosts = append(c.Hosts, HostEntry{URL: keys[1]})
				cur, inOther = &c.Hosts[len(c.Hosts)-1], false
			}
			continue
		}
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			return nil, fmt.Errorf("%w: line %d: want key = value", ErrHostsConfig, lineNo)
		}
		keys, err := splitKey(strings.TrimSpace(line[:eq]))
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrHostsConfig, lineNo, err)
		}
		raw := strings.TrimSpace(line[eq+1:])
		// An array may continue over the next lines until its brackets close.
		for strings.HasPrefix(raw, "[") && !balanced(raw) && ln+1 < len(lines) {
			ln++
			raw += " " + strings.TrimSpace(stripComment(lines[ln]))
		}
		val, err := parseValue(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %s: %v", ErrHostsConfig, lineNo, strings.Join(keys, "."), err)
		}
		if inOther || len(keys) != 1 {
			continue
		}
		if cur == nil {
			if keys[0] == "server" {
				s, ok := val.(string)
				if !ok {
					return nil, fmt.Errorf("%w: line %d: server must be a string", ErrHostsConfig, lineNo)
				}
				c.Server = s
			}
			continue
		}
		switch keys[0] {
		case "capabilities":
			cur.Capabilities, err = stringList(val)
		case "ca":
			cur.CA, err = stringList(val)
		case "skip_verify":
			cur.SkipVerify, err = boolean(val)
		case "override_path":
			cur.OverridePath, err = boolean(val)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %s: %v", ErrHostsConfig, lineNo, keys[0], err)
		}
	}
	return c, nil
}

// outsideStrings calls fn with each byte of s that is not inside a quoted
// string, until fn returns false.
func outsideStrings(s string, fn func(i int, ch byte) bool) {
	var quote byte
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case quote != 0:
			if ch == '\\' && quote == '"' {
				i++
			} else if ch == quote {
				quote = 0
			}
		case ch == '"' || ch == '\'':
			quote = ch
		default:
			if !fn(i, ch) {
				return
			}
		}
	}
}

// stripComment removes a # comment that is not inside a string.
func stripComment(s string) string {
	end := len(s)
	outsideStrings(s, func(i int, ch byte) bool {
		if ch == '#' {
			end = i
			return false
		}
		return true
	})
	return s[:end]
}

// balanced reports whether the brackets outside strings in s close.
func balanced(s string) bool {
	depth := 0
	outsideStrings(s, func(_ int, ch byte) bool {
		switch ch {
		case '[':
			depth++
		case ']':
			depth--
		}
		return true
	})
	return depth <= 0
}

// splitKey splits a dotted key whose parts may be quoted.
func splitKey(s string) ([]string, error) {
	var keys []string
	for {
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, errors.New("empty key")
		}
		var k string
		if s[0] == '"' || s[0] == '\'' {
			str, rest, err := parseString(s)
			if err != nil {
				return nil, err
			}
			k, s = str, rest
		} else {
			i := strings.IndexByte(s, '.')
			if i < 0 {
				i = len(s)
			}
			k, s = strings.TrimSpace(s[:i]), s[i:]
			for _, r := range k {
				if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
					return nil, fmt.Errorf("bad key %q", k)
				}
			}
		}
		keys = append(keys, k)
		s = strings.TrimSpace(s)
		if s == "" {
			return keys, nil
		}
		if s[0] != '.' {
			return nil, fmt.Errorf("bad key near %q", s)
		}
		s = s[1:]
	}
}

// parseString parses a basic ("…", with escapes) or literal ('…') string at
// the start of s and returns it and the rest of s.
func parseString(s string) (string, string, error) {
	q := s[0]
	if q == '\'' {
		i := strings.IndexByte(s[1:], '\'')
		if i < 0 {
			return "", "", errors.New("unterminated string")
		}
		return s[1 : 1+i], s[2+i:], nil
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			v, err := strconv.Unquote(s[:i+1])
			if err != nil {
				return "", "", fmt.Errorf("bad string %s", s[:i+1])
			}
			return v, s[i+1:], nil
		}
	}
	return "", "", errors.New("unterminated string")
}

// parseValue parses a string, boolean, integer or array of them.
func parseValue(s string) (any, error) {
	v, rest, err := parseValuePrefix(s)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(rest) != "" {
		return nil, fmt.Errorf("unexpected %q after the value", strings.TrimSpace(rest))
	}
	return v, nil
}

func parseValuePrefix(s string) (any, string, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return nil, "", errors.New("missing value")
	case s[0] == '"' || s[0] == '\'':
		return parseString(s)
	case s[0] == '[':
		var arr []any
		s = strings.TrimSpace(s[1:])
		for {
			if strings.HasPrefix(s, "]") {
				return arr, s[1:], nil
			}
			v, rest, err := parseValuePrefix(s)
			if err != nil {
				return nil, "", err
			}
			arr = append(arr, v)
			s = strings.TrimSpace(rest)
			if strings.HasPrefix(s, ",") {
				s = strings.TrimSpace(s[1:])
			} else if !strings.HasPrefix(s, "]") {
				return nil, "", errors.New("bad array")
			}
		}
	case strings.HasPrefix(s, "true"):
		return true, s[4:], nil
	case strings.HasPrefix(s, "false"):
		return false, s[5:], nil
	}
	i := strings.IndexAny(s, ",] \t")
	if i < 0 {
		i = len(s)
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(s[:i], "_", ""), 0, 64)
	if err != nil {
		return nil, "", fmt.Errorf("unsupported value %q", s[:i])
	}
	return n, s[i:], nil
}

func stringList(v any) ([]string, error) {
	switch v := v.(type) {
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, errors.New("want strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errors.New("want a string or an array of strings")
}

func boolean(v any) (bool, error) {
	b, ok := v.(bool)
	if !ok {
		return false, errors.New("want true or false")
	}
	return b, nil
}

// Mirrors returns the hosts that may serve content by digest, in order,
// followed by the server when it is not the registry itself. A host's
// client is left nil; callers that honour skip_verify and ca set it.
func (c *HostsConfig) Mirrors(registry string) []HostEntry {
	if c == nil {
		return nil
	}
	var out []HostEntry
	for _, h := range c.Hosts {
		if h.CanPull() {
			out = append(out, h)
		}
	}
	if c.Server != "" {
		if u, err := ParseMirrorURL(c.Server); err == nil && u.Host != registry &&
			!(registry == "docker.io" && u.Host == "registry-1.docker.io") {
			out = append(out, HostEntry{URL: c.Server})
		}
	}
	return out
}

// Mirror returns the host as a Mirror. Its client honours skip_verify and
// ca (added to the system roots) and gives up on a silent host after
// timeout (<= 0 means 5s); a host with neither setting gets a nil client,
// so that NewMirrorFetcher's default is shared.
func (h HostEntry) Mirror(timeout time.Duration) (Mirror, error) {
	m := Mirror{URL: h.URL, OverridePath: h.OverridePath}
	if !h.SkipVerify && len(h.CA) == 0 {
		return m, nil
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	tlsConf, err := tlsConfig(h.SkipVerify, h.CA...)
	if err != nil {
		return m, fmt.Errorf("%w: host %s: %w", ErrHostsConfig, h.URL, err)
	}
	c := defaultMirrorClient(timeout)
	c.Transport.(*http.Transport).TLSClientConfig = tlsConf
	m.Client = c
	return m, nil
}
