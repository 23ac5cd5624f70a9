package imageview

import "errors"

// ErrDestinationDigest is wrapped when the destination of an image view
// names a digest: an image reference takes a tag.
var ErrDestinationDigest = errors.New("an image reference takes a tag, not a digest")
