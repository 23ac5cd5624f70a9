// Package units parses and formats byte counts for people: 64KiB, 1.5 GiB.
package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize parses a byte count such as 4096, 64KiB, 8MiB or 2G (binary
// multiples).
func ParseSize(s string) (int64, error) {
	str := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(str, u.suffix) {
			str, mult = strings.TrimSuffix(str, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64)
	if errors.Is(err, strconv.ErrRange) && n > 0 || err == nil && n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large (at most %d bytes, 8 EiB)", s, int64(math.MaxInt64))
	}
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// Bytes formats n as "512 B", "1.5 KiB", "3.0 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
