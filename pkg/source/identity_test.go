package source

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// A GCS walk identifies each file by size, generation and MD5 under a
// scope naming the endpoint, bucket and prefix; an HTTP(S) source gives
// none.
func TestIdentitiesOfAGCSWalk(t *testing.T) {
	objects := map[string][]byte{"data/a.bin": randBytes(1, 1000), "data/sub/b.txt": []byte("bee")}
	g := newFakeGCS(t, objects)
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(g.srv.URL, "http://"))
	src, err := Open(context.Background(), "gs://b/data", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Walk(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := src.Identities()
	sum := md5.Sum(objects["data/a.bin"])
	want := `size="1000" generation="7" md5="` + base64.StdEncoding.EncodeToString(sum[:]) + `"`
	if ids.Files["a.bin"] != want || len(ids.Files) != 2 {
		t.Errorf("identifiers %q; want a.bin's %q", ids.Files, want)
	}
	if !strings.Contains(ids.Scope, `bucket="b"`) || !strings.Contains(ids.Scope, `prefix="data"`) || !strings.Contains(ids.Scope, g.srv.URL) {
		t.Errorf("scope %q names no endpoint, bucket and prefix", ids.Scope)
	}
	web, err := Open(context.Background(), "https://example.com/f.bin", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if ids := web.Identities(); ids.Scope != "" || ids.Files != nil {
		t.Errorf("an HTTP(S) source gave identifiers %+v", ids)
	}
}

// An S3 identifier needs an ETag and a time, and quotes every value, so
// that an ETag cannot pass for another field.
func TestS3Identifier(t *testing.T) {
	mod := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.FixedZone("x", 3600))
	if got, want := s3Identifier(5, `"abc-2"`, &mod, []string{"CRC64NVME"}, "FULL_OBJECT"),
		`size="5" etag="\"abc-2\"" modified="2026-01-02T02:04:05.006Z" checksum="CRC64NVME" checksum-type="FULL_OBJECT"`; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	if s3Identifier(5, "", &mod, nil, "") != "" || s3Identifier(5, `"e"`, nil, nil, "") != "" {
		t.Error("an identifier without an ETag or a time")
	}
	if a, b := s3Identifier(5, `x" modified="y`, &mod, nil, ""), s3Identifier(5, "x", &mod, nil, ""); a == b {
		t.Error("a crafted ETag gives another object's identifier")
	}
}
