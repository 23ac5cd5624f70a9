package versions

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestPublishedReport(t *testing.T) {
	tg := openLayout(t)
	p, err := publishTree(t, tg, map[string][]byte{"a": []byte("one"), "b": []byte("two")}, PublishOptions{Tag: "main", Extra: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := oci.Ref{Registry: "r.example", Repository: "vol", Tag: "main"}
	r := p.Report(ref)
	if r.Digest != p.Root.Digest.String() || r.Reference != "r.example/vol@"+r.Digest || len(r.Tags) != 3 || r.Tags[1] != "main" ||
		r.Files != p.Files || r.Bytes != 6 || r.Chunks == 0 || r.ChunksUploaded != int64(r.Chunks) || r.BytesUploaded == 0 || r.Seconds != 0 {
		t.Fatalf("report %+v", r)
	}
	b, _ := json.Marshal(r)
	for _, k := range []string{`"digest":`, `"reference":`, `"tags":[`, `"files":`, `"bytes":6`, `"chunks":`, `"chunks_uploaded":`, `"bytes_uploaded":`, `"seconds":0`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("JSON %s lacks %s", b, k)
		}
	}
}
