// Package oci is bdnvol's transport: it parses volume references, opens a
// registry repository or a local OCI image layout as an oras-go target
// (with docker credentials, TLS and retries), and manages tags.
package oci
