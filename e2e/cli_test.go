package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// Small chunking so that modest trees make many chunks.
var smallChunks = []string{"--chunk-min", "16KiB", "--chunk-avg", "64KiB", "--chunk-max", "256KiB"}

// pushResult is the --json output of push.
type pushResult struct {
	Digest         string  `json:"digest"`
	Reference      string  `json:"reference"`
	Files          int64   `json:"files"`
	Bytes          int64   `json:"bytes"`
	Chunks         int64   `json:"chunks"`
	ChunksUploaded int64   `json:"chunks_uploaded"`
	BytesUploaded  int64   `json:"bytes_uploaded"`
	Seconds        float64 `json:"seconds"`
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// pushJSON runs push --json and decodes its one JSON object, checking that
// every field of the contract is there.
func pushJSON(t testing.TB, ref, dir string, flags ...string) pushResult {
	t.Helper()
	args := append([]string{"push", "--json"}, flags...)
	args = append(args, ref, dir)
	res := mustRun(t, args...)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &fields); err != nil {
		t.Fatalf("push --json: stdout is not one JSON object: %v\n%s", err, res)
	}
	for _, k := range []string{"digest", "reference", "files", "bytes", "chunks", "chunks_uploaded", "bytes_uploaded", "seconds"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("push --json: no %q field:\n%s", k, res)
		}
	}
	var pr pushResult
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pr)
	if !digestRE.MatchString(pr.Digest) {
		t.Fatalf("push --json: bad digest %q:\n%s", pr.Digest, res)
	}
	return pr
}

// push runs push without --json, checks that the last line of stdout is
// REPO@sha256:<hex> and returns the digest.
func push(t testing.TB, repo, ref, dir string, flags ...string) string {
	t.Helper()
	args := append([]string{"push"}, flags...)
	args = append(args, ref, dir)
	res := mustRun(t, args...)
	last := res.lastLine()
	r, d, ok := strings.Cut(last, "@")
	if !ok || r != repo || !digestRE.MatchString(d) {
		t.Fatalf("push: last line of stdout is %q, want %s@sha256:<hex>\n%s", last, repo, res)
	}
	return d
}

// pull runs pull and fails the test unless it succeeds.
func pull(t testing.TB, ref, dir string, flags ...string) result {
	t.Helper()
	args := append([]string{"pull"}, flags...)
	return mustRun(t, append(args, ref, dir)...)
}

// oneLine fails the test unless stderr is exactly one non-empty line.
func oneLine(t testing.TB, res result) string {
	t.Helper()
	s := strings.TrimRight(res.stderr, "\n")
	if s == "" || strings.Contains(s, "\n") {
		t.Errorf("want exactly one line on stderr:\n%s", res)
	}
	return s
}
