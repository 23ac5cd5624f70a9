package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// faultCase is one fault the proxy injects while the CLI pushes, pulls and
// mounts through it.
type faultCase struct {
	name  string
	cfg   faultConfig
	flags []string // push flags
	// beforePull may change the faults once the version is known.
	beforePull func(p *faultProxy, idx *fileIndex)
	// What the spec demands succeed despite the fault; the rest may also
	// fail, cleanly.
	mustPush, mustPull, mustMount bool
	mustFailPull                  bool // the fault cannot be retried away
	eioFiles                      map[string]bool
}

func faultCases() []faultCase {
	return []faultCase{
		{name: "503-every-5th", cfg: faultConfig{Fail503Every: 5}, mustPush: true, mustPull: true, mustMount: true},
		{name: "429-retry-after", cfg: faultConfig{TooMany429Every: 12}, mustPush: true, mustPull: true, mustMount: true},
		{name: "flip-first-get", cfg: faultConfig{FlipFirstGET: true}},
		{
			name: "flip-one-file",
			beforePull: func(p *faultProxy, idx *fileIndex) {
				p.Set(faultConfig{FlipDigests: chunksOfFile(idx, "big.bin")})
			},
			mustPush: true, mustFailPull: true, eioFiles: map[string]bool{"big.bin": true},
		},
		{name: "no-range", cfg: faultConfig{NoRange: true}},
		{
			// The registry stops answering part-way through the push and
			// comes back for the pull.
			name:       "down-mid-push",
			cfg:        faultConfig{DownAfter: 60},
			beforePull: func(p *faultProxy, _ *fileIndex) { p.Set(faultConfig{}) },
			mustPull:   true, mustMount: true,
		},
		{
			// Every manifest PUT but the first is refused: the version is
			// stored, some of its tags are not.
			name:       "manifest-put-refused",
			cfg:        faultConfig{RefuseManifestPutsAfter: 1},
			flags:      append([]string{"--tag", "extra", "--tag", "other"}, smallChunks...),
			beforePull: func(p *faultProxy, _ *fileIndex) { p.Set(faultConfig{}) },
			mustPull:   true, mustMount: true,
		},
		{
			name:  "413-over-1MiB",
			cfg:   faultConfig{MaxBody: 1 << 20},
			flags: []string{"--chunk-min", "512KiB", "--chunk-avg", "1MiB", "--chunk-max", "4MiB"},
			// The registry takes big blobs only in parts: the push must fall
			// back to chunked uploads.
			mustPush: true, mustPull: true, mustMount: true,
		},
	}
}

// chunksOfFile is the set of digests of the chunks that hold path.
func chunksOfFile(idx *fileIndex, path string) map[string]bool {
	m := map[string]bool{}
	for _, f := range idx.Files {
		if f.Path == path {
			for _, x := range f.Extents {
				m[idx.Chunks[x[0]].Digest] = true
			}
		}
	}
	return m
}

// TestFaults pushes, pulls and mounts through a proxy that injects one fault
// at a time: each either completes bit-exact or fails with a clear error,
// a flipped byte never reaches a file under its final name, and no tag ever
// points at a partial version.
func TestFaults(t *testing.T) {
	for _, fc := range faultCases() {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			testFault(t, fc)
		})
	}
}

func testFault(t *testing.T, fc faultCase) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	flags := fc.flags
	if flags == nil {
		flags = smallChunks
	}
	const name = "vols/faults"
	direct, viaProxy := reg.Host+"/"+name, proxy.Host+"/"+name

	// Push through the faults.
	proxy.Set(fc.cfg)
	args := append(append([]string{"push", "--json"}, flags...), viaProxy+":v1", src)
	res := run(t, args...)
	t.Logf("push: exit %d, faults injected %v in %d requests", res.code, proxy.Injected(), proxy.Requests())
	var d string
	if res.code == 0 {
		var pr pushResult
		mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pr)
		d = pr.Digest
	} else {
		checkCleanFailure(t, res)
		if fc.mustPush {
			t.Errorf("push through %s must succeed (retries, chunked uploads):\n%s", fc.name, res)
		}
	}
	// Whatever happened, every tag there is resolves to a whole version.
	checkTagsWhole(t, reg, name, src)
	if d == "" {
		proxy.Set(faultConfig{})
		d = push(t, direct, direct+":v1", src, flags...)
	} else {
		// What went through the proxy was stored bit-exact.
		dst := filepath.Join(t.TempDir(), "direct")
		pull(t, direct+"@"+d, dst)
		compareTrees(t, src, dst)
	}
	_, idx := checkRoot(t, target{name: "distribution", reg: reg}, name, d)
	if fc.cfg.MaxBody > 0 {
		big := false
		for _, c := range idx.Chunks {
			big = big || c.Size > fc.cfg.MaxBody
		}
		if !big {
			t.Fatalf("test data: no chunk is over the %d-byte body limit", fc.cfg.MaxBody)
		}
	}

	// Pull through the faults.
	proxy.Set(fc.cfg)
	if fc.beforePull != nil {
		fc.beforePull(proxy, idx)
	}
	before := proxy.Injected()
	dst := filepath.Join(t.TempDir(), "dst")
	res = run(t, "pull", viaProxy+":v1", dst)
	t.Logf("pull: exit %d, faults injected %v (before: %v)", res.code, proxy.Injected(), before)
	switch {
	case res.code == 0:
		compareTrees(t, src, dst)
		if fc.mustFailPull {
			t.Errorf("pull succeeded although every read of some blobs is corrupt:\n%s", res)
		}
	default:
		checkCleanFailure(t, res)
		checkNoWrongFile(t, src, dst)
		if fc.mustPull {
			t.Errorf("pull through %s must succeed (retries):\n%s", fc.name, res)
		}
		// Without the fault, pulling into the same directory completes.
		proxy.Set(faultConfig{})
		pull(t, viaProxy+":v1", dst)
		compareTrees(t, src, dst)
	}

	t.Run("mount", func(t *testing.T) {
		proxy.Set(fc.cfg)
		if fc.beforePull != nil {
			fc.beforePull(proxy, idx)
		}
		mp, res := tryMount(t, viaProxy+":v1", "--prefetch", "none")
		if res.code != 0 {
			checkCleanFailure(t, res)
			if fc.mustMount {
				t.Errorf("mount through %s must succeed (retries):\n%s", fc.name, res)
			}
			return
		}
		eio := readThroughMount(t, src, mp)
		t.Logf("mount: EIO on %v, faults injected %v", eio, proxy.Injected())
		for _, p := range eio {
			if fc.mustMount || (fc.eioFiles != nil && !fc.eioFiles[p]) {
				t.Errorf("reading %s through the mount gave EIO; the fault %s must be retried away", p, fc.name)
			}
		}
		for p := range fc.eioFiles {
			if !strings.Contains(strings.Join(eio, "\n"), p) {
				t.Errorf("reading %s through the mount, whose chunks are always corrupt, did not give EIO", p)
			}
		}
	})
}
