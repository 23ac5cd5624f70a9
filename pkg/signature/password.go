package signature

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/term"
)

// ErrNoPassword is returned when a key needs a password and none can be
// asked for.
var ErrNoPassword = errors.New("COSIGN_PASSWORD is not set and stdin is not a terminal")

// Password returns the password of cosign key files as cosign finds it:
// COSIGN_PASSWORD when set (also empty), else typed at the terminal on
// stdin after a prompt written to prompt.
func Password(prompt io.Writer) func() ([]byte, error) {
	return func() ([]byte, error) {
		if p, ok := os.LookupEnv("COSIGN_PASSWORD"); ok {
			return []byte(p), nil
		}
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return nil, ErrNoPassword
		}
		fmt.Fprint(prompt, "Enter password for private key: ")
		p, err := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(prompt)
		return p, err
	}
}
