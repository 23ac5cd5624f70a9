package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// LoginCmd saves credentials for a registry after checking them.
type LoginCmd struct {
	Registry      string `arg:"" help:"Registry host[:port]."`
	Username      string `short:"u" required:"" help:"User name."`
	PasswordStdin bool   `name:"password-stdin" help:"Read the password from standard input."`
	Password      string `short:"p" help:"Password (prefer --password-stdin)." env:"BDNVOL_PASSWORD"`
}

// Run logs in.
func (c *LoginCmd) Run(ctx context.Context, g *Globals) error {
	pass := c.Password
	if c.PasswordStdin {
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && err != io.EOF {
			return fmt.Errorf("read password: %w", err)
		}
		pass = strings.TrimRight(line, "\r\n")
	}
	if pass == "" {
		return usageError{fmt.Errorf("login %s: give a password with --password-stdin or -p", c.Registry)}
	}
	if err := oci.Login(ctx, c.Registry, auth.Credential{Username: c.Username, Password: pass}, g.options()); err != nil {
		if errors.Is(err, oci.ErrInvalidRef) {
			return usageError{err}
		}
		return err
	}
	fmt.Fprintf(g.stderr, "logged in to %s as %s\n", c.Registry, c.Username)
	return nil
}

// LogoutCmd removes saved credentials.
type LogoutCmd struct {
	Registry string `arg:"" help:"Registry host[:port]."`
}

// Run logs out.
func (c *LogoutCmd) Run(ctx context.Context, g *Globals) error {
	return oci.Logout(ctx, c.Registry)
}
