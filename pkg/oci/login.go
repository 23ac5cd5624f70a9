package oci

import (
	"context"
	"fmt"

	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// Login checks cred against registry (host[:port]) and saves it in
// opt.Credentials, or in the docker credential store when that is nil.
func Login(ctx context.Context, registry string, cred auth.Credential, opt Options) error {
	if opt.Credentials == nil {
		store, err := credentials.NewStoreFromDocker(credentials.StoreOptions{AllowPlaintextPut: true})
		if err != nil {
			return fmt.Errorf("docker credentials: %w", err)
		}
		opt.Credentials = store
	}
	reg, err := remote.NewRegistry(registry)
	if err != nil {
		return fmt.Errorf("%w %q: %v", ErrInvalidRef, registry, err)
	}
	reg.PlainHTTP = !opt.ForceTLS && (opt.PlainHTTP || IsLoopback(registry))
	client, err := NewClient(opt)
	if err != nil {
		return err
	}
	reg.Client = client
	if err := credentials.Login(ctx, opt.Credentials, reg, cred); err != nil {
		return fmt.Errorf("login %s as %s: %w", registry, cred.Username, err)
	}
	return nil
}

// Logout removes the credentials saved for registry from the docker
// credential store.
func Logout(ctx context.Context, registry string) error {
	store, err := credentials.NewStoreFromDocker(credentials.StoreOptions{})
	if err != nil {
		return fmt.Errorf("docker credentials: %w", err)
	}
	return credentials.Logout(ctx, store, registry)
}
