package units

import (
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64KiB": 64 << 10, " 8MiB ": 8 << 20, "2G": 2 << 30, "10B": 10, "0": 0} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5MiB", "MiB", "12XB"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

// TestParseSizeOverflow: a size past int64 is refused, never wrapped (a
// wrapped --max-rate of 8589934592GiB read as 0 or negative: no bound).
func TestParseSizeOverflow(t *testing.T) {
	for _, big := range []string{"8589934592GiB", "8589934592G", "9007199254740992M", "9223372036854775807K", "9223372036854775808", "99999999999999999999KiB"} {
		n, err := ParseSize(big)
		if err == nil || !strings.Contains(err.Error(), "too large") {
			t.Errorf("ParseSize(%q) = %d, %v; want a too-large error", big, n, err)
		}
	}
	for in, want := range map[string]int64{"8589934591GiB": 8589934591 << 30, "9223372036854775807": math.MaxInt64, "9223372036854775807B": math.MaxInt64} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ParseSize("-99999999999999999999"); err == nil || strings.Contains(err.Error(), "too large") {
		t.Errorf("ParseSize of a huge negative: %v; want a bad size", err)
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 3 << 30: "3.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
