package lazy

import "errors"

// ErrNoCache is returned by Open when Options.Cache is nil.
var ErrNoCache = errors.New("lazy: no chunk cache")
