package main

import (
	"errors"

	"github.com/bdnvol/bdnvol/pkg/retention"
	"github.com/bdnvol/bdnvol/pkg/source"
)

// flagHint returns what the CLI adds to the line of err: the flag or
// command that gets past it, which the library's message does not name
// (flags are the CLI's); "" when there is none.
func flagHint(err error) string {
	var addr *source.AddressError
	switch {
	case errors.As(err, &addr) && addr.LinkLocal():
		return " (pass --allow-link-local to allow it)"
	case addr != nil:
		return " (pass --allow-private-network to allow it)"
	case errors.Is(err, retention.ErrStillNeeded):
		return " (--force deletes it anyway)"
	case errors.Is(err, retention.ErrNoDigest), errors.Is(err, retention.ErrNoTombstone):
		return " (bdnvol versions --deleted lists what can be restored)"
	case errors.Is(err, source.ErrEmpty):
		return " (after --include/--exclude)"
	}
	return ""
}
