package signature

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

func TestPasswordFromTheEnvironmentElseRefusedWithoutATerminal(t *testing.T) {
	var prompt bytes.Buffer
	t.Setenv("COSIGN_PASSWORD", "")
	if p, err := Password(&prompt)(); err != nil || len(p) != 0 {
		t.Errorf("empty COSIGN_PASSWORD: %q, %v", p, err)
	}
	t.Setenv("COSIGN_PASSWORD", "s3cret")
	if p, err := Password(&prompt)(); err != nil || string(p) != "s3cret" {
		t.Errorf("COSIGN_PASSWORD: %q, %v", p, err)
	}
	os.Unsetenv("COSIGN_PASSWORD")
	// Tests run with stdin not a terminal: no prompt, a clear error.
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	old := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = old }()
	if _, err := Password(&prompt)(); !errors.Is(err, ErrNoPassword) {
		t.Errorf("no terminal: %v", err)
	}
	if prompt.Len() != 0 {
		t.Errorf("prompted %q without a terminal", prompt.String())
	}
}
