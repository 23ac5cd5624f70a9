package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestRepeatedFlagBounded: 5,000 repeats of --exclude are a usage error
// (exit 2) that names the flag and the bound, decided before the flag
// parser runs (it cost 642 MiB of allocations); 1,000 still reach the
// command.
func TestRepeatedFlagBounded(t *testing.T) {
	pull := func(n int, form func(i int) []string) (int, string, uint64) {
		args := []string{"pull"}
		for i := range n {
			args = append(args, form(i)...)
		}
		args = append(args, "oci:"+t.TempDir()+"/missing:v1", t.TempDir()+"/d")
		var out, errb bytes.Buffer
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		code := run(args, &out, &errb)
		runtime.ReadMemStats(&after)
		return code, errb.String(), after.TotalAlloc - before.TotalAlloc
	}
	for name, form := range map[string]func(i int) []string{
		"separate": func(i int) []string { return []string{"--exclude", "some/glob/*.bin"} },
		"equals":   func(i int) []string { return []string{"--exclude=some/glob/*.bin"} },
	} {
		code, stderr, alloc := pull(5000, form)
		if code != exitUsage || !strings.Contains(stderr, `"--exclude" given 5000 times: at most 1000`) {
			t.Errorf("%s: 5000 --exclude: exit %d, %q; want exit 2 naming the bound", name, code, stderr)
		}
		if alloc > 16<<20 {
			t.Errorf("%s: 5000 --exclude allocated %d MiB", name, alloc>>20)
		}
	}
	code, stderr, _ := pull(maxRepeatedFlag, func(i int) []string { return []string{"--exclude", "x"} })
	if code != exitError || !strings.Contains(stderr, "not found") {
		t.Errorf("1000 --exclude: exit %d, %q; want the command's own error (exit 1)", code, stderr)
	}
}

// TestSizeFlagOverflow: a --max-rate past int64 bytes is a usage error, not
// a wrapped (negative: unbounded) rate.
func TestSizeFlagOverflow(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"pull", "--max-rate", "8589934592GiB", "oci:" + t.TempDir() + "/missing:v1", t.TempDir() + "/d"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "too large") {
		t.Fatalf("--max-rate 8589934592GiB: exit %d, %q; want exit 2, too large", code, errb.String())
	}
}
