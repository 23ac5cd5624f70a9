// Package signature signs and verifies sealed versions the way cosign does:
// a simple-signing payload naming the version digest, signed with a key, stored
// under cosign's tag scheme (sha256-<hex>.sig) and read from there or from OCI
// 1.1 referrers. Signer and Verifier are interfaces so that KMS and keyless
// signing can be added without touching the callers; key files are one
// implementation.
package signature
