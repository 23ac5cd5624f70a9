package e2e

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// rawControl returns the first character of s a terminal would act on (C0
// but newline and tab, DEL, C1, bidi overrides and isolates) or that is not
// UTF-8, or "" when there is none.
func rawControl(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		if r < 0x20 && r != '\n' && r != '\t' || r == 0x7f || r >= 0x80 && r <= 0x9f ||
			r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			return string(r)
		}
	}
	return ""
}

func checkNoRawControl(t *testing.T, res result) {
	t.Helper()
	for name, s := range map[string]string{"stdout": res.stdout, "stderr": res.stderr} {
		if c := rawControl(s); c != "" {
			t.Errorf("%s holds a raw %q:\n%s", name, c, res)
		}
	}
}

// addLayoutTag tags the manifest d (of size n) of the OCI layout dir with
// tag, by editing index.json as any writer of the layout could.
func addLayoutTag(t *testing.T, dir, tag, d string, n int64) {
	t.Helper()
	var idx map[string]json.RawMessage
	mustJSON(t, fileContents(t, filepath.Join(dir, "index.json")), &idx)
	var ms []map[string]any
	mustJSON(t, idx["manifests"], &ms)
	ms = append(ms, map[string]any{"mediaType": mtManifest, "digest": d, "size": n,
		"annotations": map[string]string{"org.opencontainers.image.ref.name": tag}})
	b, _ := json.Marshal(ms)
	idx["manifests"] = b
	b, _ = json.Marshal(idx)
	mustWrite(t, filepath.Join(dir, "index.json"), b)
}

// TestHostileNamesQuoted pushes files and symlinks whose names carry
// terminal escape sequences (and, in a layout, tags and a signature's
// claimed key id) and checks that inspect, diff and versions print them
// quoted, never raw, while --json keeps them as they are.
func TestHostileNamesQuoted(t *testing.T) {
	const (
		title = "a\x1b]0;pwned\x07b.txt" // retitles the window
		clear = "c\x1b[2J\x1b[H.txt"     // clears the screen
		bidi  = "e\u202etxt.exe"         // reorders the line
		c1    = "f\u009b31m.bin"         // a C1 CSI
		crlf  = "g\r\nforged line"       // forges an output line
		tgt   = "ok\x1b[31m.txt"         // a symlink target
		// a key id a signature claims (short: the table shows 16 bytes)
		hostileKey = "k\x1b]0;key\x07"
	)
	forTargets(t, func(t *testing.T, tg target) {
		src1, src2 := t.TempDir(), t.TempDir()
		buildTree(t, src1, []node{
			fileNode("ok.txt", 0o644, []byte("ok")),
			fileNode(title, 0o644, []byte("title")),
			fileNode(clear, 0o644, []byte("clear")),
			fileNode(bidi, 0o644, []byte("bidi")),
			fileNode(c1, 0o644, []byte("c1")),
			fileNode(crlf, 0o644, []byte("crlf")),
			linkNode("lnk", tgt),
		}, time.Time{})
		buildTree(t, src2, []node{fileNode("ok.txt", 0o644, []byte("changed"))}, time.Time{})
		repo := tg.repo("names")
		v1 := pushJSON(t, repo+":v1", src1, smallChunks...)
		pushJSON(t, repo+":v2", src2, smallChunks...)

		res := mustRun(t, "inspect", repo+":v1")
		checkNoRawControl(t, res)
		for _, want := range []string{`"a\x1b]0;pwned\ab.txt"`, `"c\x1b[2J\x1b[H.txt"`, `"e\u202etxt.exe"`,
			`"f\u009b31m.bin"`, `"g\r\nforged line"`, `lnk -> "ok\x1b[31m.txt"`, " ok.txt\n"} {
			if !strings.Contains(res.stdout, want) {
				t.Errorf("inspect does not show %s:\n%s", want, res.stdout)
			}
		}
		res = mustRun(t, "inspect", "--json", repo+":v1")
		var d struct {
			Files []struct {
				Path   string `json:"path"`
				Target string `json:"target"`
			} `json:"files"`
		}
		mustJSON(t, []byte(res.stdout), &d)
		got := map[string]string{}
		for _, f := range d.Files {
			got[f.Path] = f.Target
		}
		for _, p := range []string{title, clear, bidi, c1, crlf} {
			if _, ok := got[p]; !ok {
				t.Errorf("inspect --json lost %q: %v", p, got)
			}
		}
		if got["lnk"] != tgt {
			t.Errorf("inspect --json: lnk -> %q, want %q", got["lnk"], tgt)
		}

		res = mustRun(t, "diff", repo+":v2", repo+":v1")
		checkNoRawControl(t, res)
		if !strings.Contains(res.stdout, `+ "a\x1b]0;pwned\ab.txt"`) {
			t.Errorf("diff does not show the added file quoted:\n%s", res.stdout)
		}

		if tg.reg == nil {
			// A layout may hold any tag; registries refuse such names.
			dir := filepath.Join(tg.root, "names")
			m := layoutBlob(t, dir, v1.Digest)
			addLayoutTag(t, dir, "v\x1b]0;tag\x07", v1.Digest, int64(len(m)))
			// A signature whose layer claims a key id with escapes: a
			// writer of the layout (or a registry) chooses that text.
			sig, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mtManifest,
				"config": map[string]any{"mediaType": "application/vnd.oci.empty.v1+json", "digest": emptyDigest, "size": 2},
				"layers": []map[string]any{{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": emptyDigest, "size": 2,
					"annotations": map[string]string{"dev.cosignproject.cosign/signature": "", "dev.bdnvol.signature/key": hostileKey}}}})
			sd := digestOf(sig)
			mustWrite(t, filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(sd, "sha256:")), sig)
			addLayoutTag(t, dir, "sha256-"+strings.TrimPrefix(v1.Digest, "sha256:")+".sig", sd, int64(len(sig)))
			for _, args := range [][]string{{"versions", repo}, {"inspect", repo + ":v1"}} {
				res := mustRun(t, args...)
				checkNoRawControl(t, res)
				if !strings.Contains(res.stdout, `"v\x1b]0;tag\a"`) {
					t.Errorf("%s does not show the tag quoted:\n%s", args[0], res.stdout)
				}
				if !strings.Contains(res.stdout, `key "k\x1b]0;key\a"`) {
					t.Errorf("%s does not show the claimed key id quoted:\n%s", args[0], res.stdout)
				}
			}
			var vs []struct {
				Signature struct {
					Claimed []string `json:"claimed_keys"`
				} `json:"signature"`
			}
			mustJSON(t, []byte(mustRun(t, "versions", "--json", repo).stdout), &vs)
			found := false
			for _, v := range vs {
				found = found || len(v.Signature.Claimed) == 1 && v.Signature.Claimed[0] == hostileKey
			}
			if !found {
				t.Errorf("versions --json does not keep the claimed key id as it is: %+v", vs)
			}
		}
	})
}

// TestVersionsSkipsUnreadableVersion checks that a protective tag naming a
// manifest too large to be a volume's makes versions warn about that tag
// and list the others, in text and JSON.
func TestVersionsSkipsUnreadableVersion(t *testing.T) {
	root := t.TempDir()
	src := t.TempDir()
	buildTree(t, src, []node{fileNode("a.txt", 0o644, []byte("a"))}, time.Time{})
	repo := "oci:" + root + "/vol"
	v1 := pushJSON(t, repo+":v1", src, smallChunks...)
	big := append([]byte(`{"schemaVersion":2,"mediaType":"`+mtManifest+`","artifactType":"`+mtVolume+`","annotations":{"pad":"`),
		bytes.Repeat([]byte("x"), 5<<20)...)
	big = append(big, `"}}`...)
	d := digestOf(big)
	dir := filepath.Join(root, "vol")
	mustWrite(t, filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")), big)
	tag := "sealed-20250301T120000.000Z-" + strings.TrimPrefix(d, "sha256:")[:12]
	addLayoutTag(t, dir, tag, d, int64(len(big)))

	res := mustRun(t, "versions", repo)
	if !strings.Contains(res.stdout, v1.Digest) {
		t.Errorf("versions does not list %s:\n%s", v1.Digest, res)
	}
	if !strings.Contains(res.stderr, "warning") || !strings.Contains(res.stderr, tag) {
		t.Errorf("versions does not warn about %s:\n%s", tag, res)
	}
	res = mustRun(t, "versions", "--json", repo)
	var vs []struct {
		Digest string `json:"digest"`
	}
	mustJSON(t, []byte(res.stdout), &vs)
	if len(vs) != 1 || vs[0].Digest != v1.Digest {
		t.Errorf("versions --json = %+v, want only %s", vs, v1.Digest)
	}
	if !strings.Contains(res.stderr, tag) {
		t.Errorf("versions --json does not warn about %s:\n%s", tag, res)
	}
}

// TestRefusalShortensLongTarget pulls a version holding a symlink with a 5
// KiB target and checks the refusal names it briefly.
func TestRefusalShortensLongTarget(t *testing.T) {
	root := t.TempDir()
	target := strings.Repeat("../", 1700) + "x\x1b]0;pwned\x07"
	idx := fileIndex{Files: []indexEntry{{Path: "link", Type: "symlink", Mode: 0o777, Target: target}}}
	v := craftWith(t, idx, nil, nil)
	writeLayout(t, filepath.Join(root, "vol"), "v1", v)
	res := run(t, "pull", "oci:"+root+"/vol:v1", filepath.Join(root, "out"))
	if res.code != 1 {
		t.Fatalf("pull of a 5 KiB symlink target: want exit 1:\n%s", res)
	}
	checkNoRawControl(t, res)
	line := oneLine(t, res)
	if len(line) > 400 || !strings.Contains(line, `"link"`) || !strings.Contains(line, "bytes)") {
		t.Errorf("refusal of %d bytes, want a short one naming the link and the target's length: %s", len(line), line)
	}
}

// TestPullWrongChunkSizeKeepsCacheEntry pulls a version that names a cached
// chunk's digest with another size: the pull fails naming the chunk, and
// the verified cache entry stays.
func TestPullWrongChunkSizeKeepsCacheEntry(t *testing.T) {
	root := t.TempDir()
	chunk := bytes.Repeat([]byte("a verified chunk\n"), 64)
	good := craftWith(t, fileIndex{Files: []indexEntry{fileEntry("a", 0o644, chunk, 0)}}, [][]byte{chunk}, nil)
	writeLayout(t, filepath.Join(root, "good"), "v1", good)
	mustRun(t, "pull", "--cache", "oci:"+root+"/good:v1", filepath.Join(root, "out1"))
	d := digestOf(chunk)
	entry := filepath.Join(home(t), "bdnvol", "chunks", "sha256", strings.TrimPrefix(d, "sha256:"))
	if !bytes.Equal(fileContents(t, entry), chunk) {
		t.Fatal("pull --cache did not store the chunk")
	}

	// The same chunk digest, declared 5 bytes longer, in the index and the
	// manifest alike.
	idx := fileIndex{Version: 1, Chunking: chunking{Min: 1 << 20, Avg: 4 << 20, Max: 8 << 20},
		Chunks: []chunkRef{{Digest: d, Size: int64(len(chunk)) + 5}},
		Files:  []indexEntry{fileEntry("a", 0o644, chunk, 0)}}
	ib, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	m := ociManifest{SchemaVersion: 2, MediaType: mtManifest, ArtifactType: mtVolume,
		Config: &descriptor{MediaType: mtEmpty, Digest: emptyDigest, Size: 2},
		Layers: []descriptor{{MediaType: mtFileIndex, Digest: digestOf(ib), Size: int64(len(ib))},
			{MediaType: mtChunk, Digest: d, Size: int64(len(chunk)) + 5}}}
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	bad := version{blobs: map[string][]byte{emptyDigest: []byte("{}"), digestOf(ib): ib, d: chunk},
		manifest: mb, digest: digestOf(mb), index: idx}
	writeLayout(t, filepath.Join(root, "bad"), "v1", bad)
	res := run(t, "pull", "oci:"+root+"/bad:v1", filepath.Join(root, "out2"))
	t.Logf("stderr: %s", res.stderr)
	if res.code != 1 || !strings.Contains(res.stderr, d) {
		t.Errorf("pull of a wrong chunk size: want exit 1 naming %s:\n%s", d, res)
	}
	if !bytes.Equal(fileContents(t, entry), chunk) {
		t.Fatal("the verified cache entry was deleted or changed")
	}
	// And the good version still pulls from the cache.
	mustRun(t, "pull", "oci:"+root+"/good:v1", filepath.Join(root, "out3"))
}
