package versions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

var smallParams = layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}

// pushVersion pushes files to t as a version sealed at sealed, with tags.
func pushVersion(t *testing.T, tg oci.Target, files map[string][]byte, sealed time.Time, tags ...string) *push.Result {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	testutil.WriteTree(t, dir, files)
	res, err := push.Push(ctx, tg, push.DirSource(dir), push.Options{Params: smallParams})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.TagVersion(ctx, tg, res.Root, res.RootBytes, tags, sealed); err != nil {
		t.Fatal(err)
	}
	return res
}

func openLayout(t *testing.T) oci.Target {
	t.Helper()
	tg, err := oci.Open(context.Background(), oci.Ref{Layout: filepath.Join(t.TempDir(), "vol")}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func threeVersions(t *testing.T, tg oci.Target) [3]*push.Result {
	base := map[string][]byte{"a.bin": testutil.Pattern(1, 200<<10), "b.txt": []byte("hello")}
	v1 := pushVersion(t, tg, base, t0, "v1")
	two := map[string][]byte{"a.bin": append(testutil.Pattern(1, 200<<10), testutil.Pattern(9, 50<<10)...), "b.txt": []byte("hello"), "c.txt": []byte("new")}
	v2 := pushVersion(t, tg, two, t0.Add(time.Minute), "v2")
	three := map[string][]byte{"a.bin": testutil.Pattern(1, 200<<10), "d.txt": []byte("d")}
	v3 := pushVersion(t, tg, three, t0.Add(2*time.Minute), "v3", "prod")
	return [3]*push.Result{v1, v2, v3}
}

func TestListLayout(t *testing.T) {
	tg := openLayout(t)
	vs := threeVersions(t, tg)
	got, err := List(context.Background(), tg)
	if err != nil {
		t.Fatal(err)
	}
	checkList(t, got, vs)
}

func checkList(t *testing.T, got []Version, vs [3]*push.Result) {
	t.Helper()
	if len(got) != 3 {
		t.Fatalf("%d versions, want 3: %+v", len(got), got)
	}
	wantTags := [][]string{{"prod", "v3"}, {"v2"}, {"v1"}}
	for i, v := range got {
		want := vs[2-i]
		if v.Digest != want.Root.Digest {
			t.Errorf("version %d is %s, want %s", i, v.Digest, want.Root.Digest)
		}
		if !slices.Equal(v.Tags, wantTags[i]) {
			t.Errorf("version %d tags %v, want %v", i, v.Tags, wantTags[i])
		}
		if v.Files != want.Files || v.Bytes != want.Bytes || v.Chunks != want.Chunks {
			t.Errorf("version %d: files %d bytes %d chunks %d, want %d %d %d", i, v.Files, v.Bytes, v.Chunks, want.Files, want.Bytes, want.Chunks)
		}
		if !v.Sealed.Equal(t0.Add(time.Duration(2-i) * time.Minute)) {
			t.Errorf("version %d sealed %v", i, v.Sealed)
		}
	}
}

// fakeRegistry serves the manifests and blobs of a layout target and a tag
// list that is either paginated with Link headers or always whole
// (ignoring n and last, as distribution 2.8 does).
type fakeRegistry struct {
	src      oci.Target
	paginate int               // page size; 0 ignores n and last
	extra    map[string][]byte // manifests served by tag, beside src's

	mu        sync.Mutex
	tagsCalls int
}

func (f *fakeRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := strings.TrimPrefix(r.URL.Path, "/v2/vol/")
	switch {
	case r.URL.Path == "/v2/":
		w.WriteHeader(http.StatusOK)
	case p == "tags/list":
		f.mu.Lock()
		f.tagsCalls++
		f.mu.Unlock()
		tags, err := oci.ListTags(ctx, f.src)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		for tag := range f.extra {
			tags = append(tags, tag)
		}
		sort.Strings(tags)
		if f.paginate > 0 {
			last := r.URL.Query().Get("last")
			i := sort.SearchStrings(tags, last)
			if last != "" && i < len(tags) && tags[i] == last {
				i++
			}
			end := min(i+f.paginate, len(tags))
			if end < len(tags) {
				w.Header().Set("Link", fmt.Sprintf(`</v2/vol/tags/list?n=%d&last=%s>; rel="next"`, f.paginate, tags[end-1]))
			}
			tags = tags[i:end]
		} else {
			slices.Reverse(tags) // unsorted, as distribution 2.8 answers
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"name":"vol","tags":["%s"]}`, strings.Join(tags, `","`))
	case strings.HasPrefix(p, "manifests/"), strings.HasPrefix(p, "blobs/"):
		ref := p[strings.IndexByte(p, '/')+1:]
		if b, ok := f.extra[ref]; ok && strings.HasPrefix(p, "manifests/") {
			w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
			w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			if r.Method != http.MethodHead {
				_, _ = w.Write(b)
			}
			return
		}
		desc, err := f.src.Resolve(ctx, ref)
		if err != nil {
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			return
		}
		b, err := content.FetchAll(ctx, f.src, desc)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		if strings.HasPrefix(p, "manifests/") {
			w.Header().Set("Content-Type", desc.MediaType)
		}
		w.Header().Set("Docker-Content-Digest", desc.Digest.String())
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		if r.Method != http.MethodHead {
			_, _ = w.Write(b)
		}
	default:
		http.NotFound(w, r)
	}
}

func TestListRegistryPagination(t *testing.T) {
	src := openLayout(t)
	vs := threeVersions(t, src)
	for _, page := range []int{0, 2} {
		t.Run(fmt.Sprint("page=", page), func(t *testing.T) {
			f := &fakeRegistry{src: src, paginate: page}
			srv := httptest.NewServer(f)
			defer srv.Close()
			ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol")
			if err != nil {
				t.Fatal(err)
			}
			tg, err := oci.Open(context.Background(), ref, oci.Options{Credentials: noCreds{}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := List(context.Background(), tg)
			if err != nil {
				t.Fatal(err)
			}
			checkList(t, got, vs)
			if page > 0 && f.tagsCalls < 3 {
				t.Errorf("%d tag list requests: pagination was not followed", f.tagsCalls)
			}
		})
	}
}

func TestResolveRefusesNonVolume(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	threeVersions(t, tg)
	r, err := Resolve(ctx, tg, oci.Ref{Layout: "x", Tag: "prod"})
	if err != nil {
		t.Fatalf("resolve prod: %v", err)
	}
	if r.Files != 2 {
		t.Fatalf("resolve prod: %d files, want 2", r.Files)
	}
	other := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}`)
	desc := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, other)
	if err := tg.Push(ctx, desc, bytes.NewReader(other)); err != nil {
		t.Fatal(err)
	}
	if err := tg.Tag(ctx, desc, "image"); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(ctx, tg, oci.Ref{Layout: "x", Tag: "image"}); !errors.Is(err, layout.ErrNotVolume) {
		t.Fatalf("resolve image: %v, want ErrNotVolume", err)
	}
	if _, err := Resolve(ctx, tg, oci.Ref{Layout: "x", Tag: "nope"}); !errors.Is(err, oci.ErrNotFound) {
		t.Fatalf("resolve nope: %v, want ErrNotFound", err)
	}
	if _, err := Tag(ctx, tg, &Root{Desc: desc, Manifest: other}, []string{"sealed-x"}, TagOptions{}); !errors.Is(err, ErrReservedTag) {
		t.Fatalf("tag sealed-x: %v", err)
	}
}

func TestTagAndHistory(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	vs := threeVersions(t, tg)
	root := func(i int) *Root {
		r, err := Stat(ctx, tg, vs[i].Root)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// prod: v3 -> v1 (rollback) -> v3.
	m1, err := Tag(ctx, tg, root(0), []string{"prod", "stable"}, TagOptions{Now: t0.Add(time.Hour)})
	if err != nil || len(m1) != 2 {
		t.Fatalf("tag v1: %v %+v", err, m1)
	}
	m2, err := Tag(ctx, tg, root(2), []string{"prod"}, TagOptions{Now: t0.Add(2 * time.Hour)})
	if err != nil || len(m2) != 1 {
		t.Fatalf("tag v3: %v %+v", err, m2)
	}
	// Re-tagging where it already points is no move.
	if m, err := Tag(ctx, tg, root(2), []string{"prod"}, TagOptions{}); err != nil || len(m) != 0 {
		t.Fatalf("re-tag: %v %+v", err, m)
	}
	h, err := ReadHistory(ctx, tg, "prod")
	if err != nil {
		t.Fatal(err)
	}
	d := func(i int) digest.Digest { return vs[i].Root.Digest }
	want := []Move{
		{Time: t0.Add(time.Hour), Digest: d(0), Previous: d(2), Op: OpTag},
		{Time: t0.Add(2 * time.Hour), Digest: d(2), Previous: d(0), Op: OpTag},
	}
	if len(h.Moves) != len(want) {
		t.Fatalf("history %+v", h)
	}
	for i := range want {
		g := h.Moves[i]
		if !g.Time.Equal(want[i].Time) || g.Digest != want[i].Digest || g.Previous != want[i].Previous || g.Op != want[i].Op {
			t.Errorf("move %d: %+v, want %+v", i, g, want[i])
		}
	}
	hs, err := ReadHistory(ctx, tg, "stable")
	if err != nil || len(hs.Moves) != 1 || hs.Moves[0].Previous != "" {
		t.Fatalf("stable history: %+v %v", hs, err)
	}
	if hn, err := ReadHistory(ctx, tg, "never"); err != nil || len(hn.Moves) != 0 {
		t.Fatalf("empty history: %+v %v", hn, err)
	}
	// History records are not versions, and their tags are not human tags.
	vl, err := List(ctx, tg)
	if err != nil || len(vl) != 3 {
		t.Fatalf("list: %v %+v", err, vl)
	}
	if !slices.Equal(vl[0].Tags, []string{"prod", "v3"}) || !slices.Equal(vl[2].Tags, []string{"stable", "v1"}) {
		t.Fatalf("tags after moves: %v / %v", vl[0].Tags, vl[2].Tags)
	}
}

func TestHistoryTagLength(t *testing.T) {
	if HistoryTag("prod") != "history-prod" {
		t.Fatal(HistoryTag("prod"))
	}
	long := strings.Repeat("x", 128)
	if h := HistoryTag(long); len(h) > 128 || !strings.HasPrefix(h, HistoryTagPrefix) || h == HistoryTag(long[:127]+"y") {
		t.Fatalf("long history tag %q", h)
	}
}

func TestInspectAndCompare(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	vs := threeVersions(t, tg)
	det, err := Inspect(ctx, tg, vs[2].Root)
	if err != nil {
		t.Fatal(err)
	}
	if det.FormatVersion != layout.FormatVersion || !slices.Equal(det.Tags, []string{"prod", "v3"}) || det.Sealed == nil || !det.Sealed.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("inspect: %+v", det)
	}
	if det.Chunks != vs[2].Chunks || det.UniqueBytes <= 0 || det.Files.Len() != vs[2].Files {
		t.Fatalf("inspect counts: %+v", det)
	}
	var sawD bool
	for f := range det.Files.All() {
		if f.Path == "d.txt" {
			sawD = f.Size == 1 && f.SHA256 == digest.FromString("d").Encoded() && f.Mode&0o777 == 0o644
		}
	}
	if !sawD {
		t.Fatalf("inspect files: %+v", det.Files)
	}

	diff, err := Compare(ctx, Located{tg, vs[0].Root}, Located{tg, vs[1].Root})
	if err != nil {
		t.Fatal(err)
	}
	paths := func(fs []FileInfo) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.Path)
		}
		return out
	}
	if !slices.Equal(paths(diff.Added), []string{"c.txt"}) || len(diff.Removed) != 0 ||
		len(diff.Changed) != 1 || diff.Changed[0].Path != "a.bin" || diff.Changed[0].Size != 250<<10 {
		t.Fatalf("diff files: %+v", diff)
	}
	if diff.SharedChunks == 0 || diff.NewChunks == 0 || diff.SharedBytes+diff.NewBytes > 250<<10+16 {
		t.Fatalf("diff chunks: %+v", diff)
	}
	// v2 was pushed on top of v1 only: the diff predicts its upload.
	if diff.UploadBytes != vs[1].BytesUploaded {
		t.Fatalf("diff predicts %d uploaded bytes, push uploaded %d", diff.UploadBytes, vs[1].BytesUploaded)
	}
	same, err := Compare(ctx, Located{tg, vs[2].Root}, Located{tg, vs[2].Root})
	if err != nil || same.UploadBytes != 0 || same.Unchanged != vs[2].Files || len(same.Changed) != 0 {
		t.Fatalf("self diff: %+v %v", same, err)
	}
}

// noCreds is an empty credential store, so tests never read the user's.
type noCreds struct{}

func (noCreds) Get(context.Context, string) (auth.Credential, error) {
	return auth.EmptyCredential, nil
}
func (noCreds) Put(context.Context, string, auth.Credential) error { return nil }
func (noCreds) Delete(context.Context, string) error               { return nil }

func TestRecordKeepsNewestMoves(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	threeVersions(t, tg)
	prev := map[string]digest.Digest{"x": digest.FromString("a")}
	if err := RecordPush(ctx, tg, digest.FromString("b"), []string{"x", "same"}, map[string]digest.Digest{"x": prev["x"], "same": digest.FromString("b")}, t0); err != nil {
		t.Fatal(err)
	}
	if h, err := ReadHistory(ctx, tg, "same"); err != nil || len(h.Moves) != 0 {
		t.Fatalf("a push that did not move a tag recorded %+v %v", h, err)
	}
	moves := make([]Move, MaxMoves+10)
	for i := range moves {
		moves[i] = Move{Time: t0.Add(time.Duration(i) * time.Second), Digest: digest.FromString(strconv.Itoa(i)), Op: OpTag}
	}
	if err := Record(ctx, tg, "x", moves...); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHistory(ctx, tg, "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Moves) != MaxMoves || h.Dropped != 11 || h.Moves[len(h.Moves)-1].Digest != moves[len(moves)-1].Digest {
		t.Fatalf("%d moves kept, %d dropped", len(h.Moves), h.Dropped)
	}
}

// TestListAllReportsUnreadable checks that protective tags naming an
// oversized or broken manifest are reported while the other versions are
// listed, and that List refuses with an error naming the tag.
func TestListAllReportsUnreadable(t *testing.T) {
	ctx := context.Background()
	src := openLayout(t)
	vs := threeVersions(t, src)
	big := append([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"`+layout.ArtifactTypeVolume+`","annotations":{"pad":"`),
		bytes.Repeat([]byte("x"), layout.MaxManifestBytes)...)
	big = append(big, `"}}`...)
	broken := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"`)
	extra := map[string][]byte{}
	var tags []string
	for i, b := range [][]byte{big, broken} {
		tag := oci.ProtectiveTag(digest.FromBytes(b), t0.Add(time.Duration(10+i)*time.Minute))
		extra[tag] = b
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	srv := httptest.NewServer(&fakeRegistry{src: src, extra: extra})
	defer srv.Close()
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{Credentials: noCreds{}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListAll(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	checkList(t, l.Versions, vs)
	if len(l.Unreadable) != 2 {
		t.Fatalf("unreadable %v, want the 2 bad protective tags", l.Unreadable)
	}
	for i, u := range l.Unreadable {
		if u.Tag != tags[i] || !errors.Is(u.Err, ErrUnreadableVersion) || !strings.Contains(u.Err.Error(), tags[i]) {
			t.Errorf("unreadable %d: %s: %v, want %s", i, u.Tag, u.Err, tags[i])
		}
		t.Logf("%v", u.Err)
	}
	if _, err := List(ctx, tg); !errors.Is(err, ErrUnreadableVersion) {
		t.Fatalf("List: %v, want ErrUnreadableVersion", err)
	}
}
