package main

import (
	"io"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Size is a byte count that parses suffixes such as KiB, MiB and GiB.
type Size int64

// UnmarshalText parses a size such as 4096, 64KiB or 8MiB.
func (s *Size) UnmarshalText(b []byte) error {
	n, err := units.ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// startProgress draws a progress line of c on w while work runs, if w is
// a terminal; the returned function stops it and clears the line.
func startProgress(w io.Writer, verb string, c *layout.Counters) func() {
	return progress.Start(w, verb, func() (int64, int64, int64) { return c.Total.Load(), c.Processed.Load(), c.Sent.Load() })
}
