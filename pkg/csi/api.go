package csi

// The mounter's API: JSON over HTTP on a unix socket, spoken only by the
// node plugin on the same node.

// mountRequest asks the mounter for the mount of one digest.
type mountRequest struct {
	// Ref is the digest-pinned reference, HOST/REPO@sha256:...
	Ref string `json:"ref"`
	// Prefetch is what to fetch in the background when the digest is
	// first mounted (as `bdnvol mount --prefetch`).
	Prefetch string `json:"prefetch,omitempty"`
	// Auth is the registry credential to fetch with when the digest is
	// first mounted; nil uses the node's docker config. Kept in memory.
	Auth *credential `json:"auth,omitempty"`
	// IndexKeys are the PEM public keys of the volume's signature policy:
	// an index published beside a ModelPack model and signed by one of
	// them is used instead of reading the model's layers whole.
	IndexKeys []string `json:"index_keys,omitempty"`
}

// credential is a registry credential handed to the mounter.
type credential struct {
	Username     string `json:"username,omitempty"`
	Password     string `json:"password,omitempty"`
	RefreshToken string `json:"refresh_token,omitempty"`
	AccessToken  string `json:"access_token,omitempty"`
}

// MountInfo describes one version's mount held by the mounter.
type MountInfo struct {
	Digest string `json:"digest"`
	Ref    string `json:"ref"`
	// Key is REGISTRY/REPOSITORY@DIGEST, what the mount is keyed by (see
	// MountKey); empty from a mounter older than mount keys.
	Key   string `json:"key,omitempty"`
	Path  string `json:"path"`  // the FUSE mountpoint
	Bytes int64  `json:"bytes"` // the volume's size
	Files int64  `json:"files"` // its entries
	// New is true when this request mounted it.
	New bool `json:"new,omitempty"`
}

// unmountRequest asks the mounter to unmount one version: the mount of
// Ref (a mount key, REGISTRY/REPOSITORY@DIGEST) or, when Ref is empty (a
// node plugin older than mount keys), every mount of Digest.
type unmountRequest struct {
	Digest string `json:"digest"`
	Ref    string `json:"ref,omitempty"`
}

// apiError is the body of a failed request.
type apiError struct {
	Kind    string `json:"kind"` // one of the kind* constants
	Message string `json:"message"`
}
