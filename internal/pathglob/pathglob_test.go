package pathglob

import "testing"

func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		include, exclude []string
		path             string
		want             bool
	}{
		{nil, nil, "a/b.bin", true},
		{[]string{"*.safetensors"}, nil, "shards/model-00001.safetensors", true},
		{[]string{"*.safetensors"}, nil, "model.bin", false},
		{nil, []string{"*.md"}, "docs/README.md", false},
		{nil, []string{"original/"}, "original/consolidated.pth", false},
		{nil, []string{"original/"}, "originals.txt", true},
		{[]string{"model-0000[12].bin"}, nil, "model-00002.bin", true},
		{[]string{"model-0000[!12].bin"}, nil, "model-00002.bin", false},
		{[]string{"a?c"}, nil, "abc", true},
		{[]string{"*.json"}, []string{"tokenizer*"}, "tokenizer.json", false},
	} {
		f, err := New(tc.include, tc.exclude)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Match(tc.path); got != tc.want {
			t.Errorf("include %v exclude %v: match(%q) = %v", tc.include, tc.exclude, tc.path, got)
		}
	}
	if _, err := New([]string{"[abc"}, nil); err == nil {
		t.Error("unclosed [ accepted")
	}
}

func TestNilKeepsAll(t *testing.T) {
	var f *Filter
	if !f.Match("any/path") || !f.All() {
		t.Error("a nil Filter does not keep every path")
	}
	if g, _ := New(nil, []string{"*.md"}); g.All() {
		t.Error("a Filter with an exclude reports All")
	}
}
