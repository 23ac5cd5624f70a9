// Package byterange writes HTTP Range headers and reads Content-Range
// answers, for the closed single ranges bdnvol asks for.
package byterange

import (
	"strconv"
	"strings"
)

// Header returns the Range header value for n bytes at off: a single
// closed range, which every registry and object store accepts.
func Header(off, n int64) string {
	return "bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+n-1, 10)
}

// Start returns the first byte position of a Content-Range value
// ("bytes a-b/size").
func Start(contentRange string) (int64, bool) {
	rest, ok := strings.CutPrefix(contentRange, "bytes ")
	if !ok {
		return 0, false
	}
	a, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(a, 10, 64)
	return v, err == nil
}
