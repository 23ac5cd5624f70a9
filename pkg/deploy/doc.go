// Package deploy reads deploy files and keeps the volume references in them
// pinned: it parses bdnvol.yaml (a list of mounts), finds the volume
// references in any YAML or JSON document, rewrites tag references into
// digest-pinned ones in place without touching anything else, and lints
// references that are not pinned, do not resolve, or whose tag has moved.
//
// # Deploy file
//
// bdnvol.yaml: `mounts: [{source: REF, path: /abs/path, readOnly: true}]`.
// docs/deploy.md is the contract.
//
// # Volume reference
//
// A string that names a volume version: the value of any `source:` key; in a
// Kubernetes `csi:` volume source whose `driver` is csi.bdnvol.dev (a pod's
// inline volume or a PersistentVolume's spec.csi), `volumeAttributes.ref`, or
// `volumeHandle` when there is no `ref`; and with the All option any string
// that parses as a reference with a tag or a digest and resolves to a bdnvol
// volume.
//
// # Pinned reference
//
// REPO:TAG@sha256:<hex> (or REPO@sha256:<hex>): the digest is what runs; the
// tag only says where it came from, and lint checks it has not moved.
package deploy
