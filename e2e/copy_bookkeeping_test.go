package e2e

import (
	"archive/tar"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// forgeIndex rewrites archive src into dst with extra tags in index.json:
// each of add names an existing tag whose descriptor the new tag copies.
func forgeIndex(t *testing.T, src, dst string, add map[string]string) {
	t.Helper()
	rewriteArchive(t, src, dst, func(h *tar.Header, b []byte, _ *tar.Writer) (*tar.Header, []byte) {
		if h.Name != "index.json" {
			return h, b
		}
		var idx map[string]any
		mustJSON(t, b, &idx)
		ms := idx["manifests"].([]any)
		for newTag, from := range add {
			found := false
			for _, m := range ms {
				d := m.(map[string]any)
				ann, _ := d["annotations"].(map[string]any)
				if ann != nil && ann["org.opencontainers.image.ref.name"] == from {
					c := map[string]any{}
					for k, v := range d {
						c[k] = v
					}
					c["annotations"] = map[string]any{"org.opencontainers.image.ref.name": newTag}
					ms = append(ms, c)
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("the archive has no tag %s", from)
			}
		}
		idx["manifests"] = ms
		nb, _ := json.Marshal(idx)
		return h, nb
	})
}

// historyMoves returns the digests and ops of tag's recorded moves.
func historyMoves(t *testing.T, ref string) []string {
	t.Helper()
	var h struct {
		Moves []struct {
			Digest string `json:"digest"`
			Op     string `json:"op"`
		} `json:"moves"`
	}
	mustJSON(t, []byte(mustRun(t, "history", "--json", ref).stdout), &h)
	var out []string
	for _, m := range h.Moves {
		out = append(out, m.Op+" "+m.Digest)
	}
	return out
}

// An archive forged from another repository (its own prod and history of
// prod, its signature tagged for a version of the destination it does not
// carry) imports without rewriting the destination's bookkeeping: the
// destination's history of prod is kept with the import's move appended,
// the signature of the version the archive does not carry is left and still
// verifies, and the move of prod is reported with its old digest. An
// archive whose protective tag names a destination version but points at
// its own is refused, with nothing moved.
func TestCopyArchiveKeepsBookkeeping(t *testing.T) {
	bin(t)
	key, pub := keyPair(t, t.TempDir(), "site")
	akey, _ := keyPair(t, t.TempDir(), "attacker")
	site := newDistribution(t)
	repo := site.Host + "/model"
	d1 := pushJSON(t, repo+":v1", smallVolume(t, 1), "--tag", "prod").Digest
	d2 := pushJSON(t, repo+":v2", smallVolume(t, 2)).Digest
	mustRun(t, "tag", repo+":v2", "prod")
	if res := signRun(t, "sign", "--key", key, repo+":v1"); res.code != 0 {
		t.Fatalf("sign:\n%s", res)
	}
	before := historyMoves(t, repo+":prod")
	if len(before) != 2 {
		t.Fatalf("the site's history of prod: %v", before)
	}

	atk := newDistribution(t)
	dx := pushJSON(t, atk.Host+"/x:v9", smallVolume(t, 9), "--tag", "prod").Digest // with a history of prod
	if res := signRun(t, "sign", "--key", akey, atk.Host+"/x:prod"); res.code != 0 {
		t.Fatalf("sign:\n%s", res)
	}
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.tar")
	mustRun(t, "copy", "--all-tags", atk.Host+"/x", "oci-archive:"+plain)
	forged := filepath.Join(dir, "forged.tar")
	forgeIndex(t, plain, forged, map[string]string{sigTag(d1): sigTag(dx)})

	res := mustRun(t, "copy", "--json", "oci-archive:"+forged, repo)
	var r struct {
		Moved []struct{ Tag, From, To string } `json:"moved"`
		Kept  []struct{ Tag, Reason string }   `json:"kept"`
	}
	mustJSON(t, []byte(res.stdout), &r)
	t.Logf("import of the forged archive:\n%s", res.stderr)
	if len(r.Moved) != 1 || r.Moved[0].Tag != "prod" || r.Moved[0].From != d2 || r.Moved[0].To != dx {
		t.Errorf("moved %+v, want prod from %s to %s", r.Moved, d2, dx)
	}
	if !strings.Contains(res.stderr, "moved tag prod from "+d2+" to "+dx) {
		t.Errorf("stderr does not report the move of prod:\n%s", res.stderr)
	}
	after := historyMoves(t, repo+":prod")
	if len(after) != 3 || after[0] != before[0] || after[1] != before[1] || after[2] != "copy "+dx {
		t.Errorf("history of prod after the import %v, want %v then copy %s", after, before, dx)
	}
	if got := tagDigest(t, site, "model", sigTag(d1)); got == "" {
		t.Errorf("the site lost %s", sigTag(d1))
	}
	kept := false
	for _, k := range r.Kept {
		kept = kept || k.Tag == sigTag(d1)
	}
	if !kept {
		t.Errorf("the import does not report %s as kept: %+v", sigTag(d1), r.Kept)
	}
	mustRun(t, "verify", "--key", pub, repo+"@"+d1)

	// A protective tag naming v1 but pointing at the archive's version.
	sealed := filepath.Join(dir, "sealed.tar")
	forgeIndex(t, plain, sealed, map[string]string{"sealed-20250101T000000.000Z-" + strings.TrimPrefix(d1, "sha256:")[:12]: "prod"})
	mustRun(t, "tag", repo+":v2", "prod")
	res = run(t, "copy", "oci-archive:"+sealed, repo)
	if res.code == 0 || !strings.Contains(res.stderr, "does not carry") {
		t.Errorf("import of an archive with a forged protective tag:\n%s", res)
	}
	if got := tagDigest(t, site, "model", "prod"); got != d2 {
		t.Errorf("the refused import moved prod to %s", got)
	}
}
