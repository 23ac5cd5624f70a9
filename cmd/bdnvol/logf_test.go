package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestLogfEscapes: library code logs errors that can carry a registry's
// or a volume's text through logf; what a terminal would act on comes out
// escaped, on one line.
func TestLogfEscapes(t *testing.T) {
	var buf bytes.Buffer
	g := &Globals{stderr: &buf}
	g.logf("retrying chunk %s: %v", "c", errors.New("502: \x1b]0;pwned\x07\r\u202e"))
	got := buf.String()
	if want := "bdnvol: retrying chunk c: 502: \\x1b]0;pwned\\a\\r\\u202e\n"; got != want {
		t.Errorf("logf wrote %q, want %q", got, want)
	}
	if strings.ContainsAny(got, "\x1b\x07\r") {
		t.Errorf("logf wrote a raw control character: %q", got)
	}
}
