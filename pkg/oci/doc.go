// Package oci is bdnvol's transport: it parses volume references, opens a
// registry repository or a local OCI image layout as an oras-go target
// (with docker credentials, TLS and retries), manages tags, and fetches
// content by digest from registry mirrors configured by flag or by a
// containerd hosts.toml, falling back to the registry.
package oci
