package profile

import "errors"

// ErrOtherVersion means a profile belongs to a version other than the one
// it is replayed against.
var ErrOtherVersion = errors.New("profile of another version")

// ErrInvalid means a profile document is malformed, too large or of
// another media type.
var ErrInvalid = errors.New("invalid profile")

// ErrNotFound means no profile of the version is stored or attached.
var ErrNotFound = errors.New("no profile")
