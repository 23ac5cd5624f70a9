package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestPinFileWritesInPlaceKeepingTheMode(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "bdnvol.yaml")
	in := "mounts:\n- source: reg.example/llama:prod\n  path: /m\n- source: reg.example/llama:gone\n  path: /n\n"
	if err := os.WriteFile(file, []byte(in), 0o640); err != nil {
		t.Fatal(err)
	}
	// Without write: the changes are told, the file stays.
	changes, refErrs, err := PinFile(ctx, file, newFake(), PinOptions{}, false)
	if err != nil || len(changes) != 1 || changes[0].Line != 2 || len(refErrs) != 1 || refErrs[0].Line != 4 || !errors.Is(refErrs[0], oci.ErrNotFound) {
		t.Fatalf("check: %+v, %+v, %v", changes, refErrs, err)
	}
	if b, _ := os.ReadFile(file); string(b) != in {
		t.Fatalf("a check rewrote the file:\n%s", b)
	}
	changes, _, err = PinFile(ctx, file, newFake(), PinOptions{}, true)
	if err != nil || len(changes) != 1 {
		t.Fatalf("pin: %+v, %v", changes, err)
	}
	b, _ := os.ReadFile(file)
	if want := strings.Replace(in, "llama:prod", "llama:prod@"+dProd.String(), 1); string(b) != want {
		t.Fatalf("pinned:\n%s\nwant:\n%s", b, want)
	}
	if st, _ := os.Stat(file); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	// Not YAML: an error naming the file, not a reference error.
	os.WriteFile(file, []byte("a: [\n"), 0o644)
	if _, refErrs, err := PinFile(ctx, file, newFake(), PinOptions{}, true); err == nil || refErrs != nil || !strings.HasPrefix(err.Error(), file+": ") {
		t.Errorf("bad YAML: %v, %v", refErrs, err)
	}
	if _, _, err := PinFile(ctx, file+".none", newFake(), PinOptions{}, true); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}

func TestRefErrors(t *testing.T) {
	a, b := &RefError{Line: 1, Ref: "a", Err: oci.ErrNotFound}, &RefError{Line: 2, Ref: "b", Err: oci.ErrNotFound}
	if got := RefErrors(errors.Join(a, b)); len(got) != 2 || got[0] != a || got[1] != b {
		t.Errorf("joined: %+v", got)
	}
	if got := RefErrors(a); len(got) != 1 {
		t.Errorf("one: %+v", got)
	}
	if got := RefErrors(errors.Join(a, errors.New("other"))); got != nil {
		t.Errorf("with another error: %+v", got)
	}
}

func TestLintFileNamesTheFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.yaml")
	os.WriteFile(file, []byte("mounts:\n- source: reg.example/llama:prod\n  path: /m\n"), 0o644)
	fs, err := LintFile(context.Background(), file, newFake(), LintOptions{})
	if err != nil || len(fs) != 1 || fs[0].Line != 2 || fs[0].File != file {
		t.Fatalf("findings %+v, %v", fs, err)
	}
	b, _ := json.Marshal(fs[0])
	if want := `{"file":` + strconv.Quote(file) + `,"line":2,"reference":"reg.example/llama:prod","reason":` + strconv.Quote(fs[0].Reason) + `}`; string(b) != want {
		t.Errorf("JSON %s\nwant %s", b, want)
	}
	os.WriteFile(file, []byte("a: [\n"), 0o644)
	if _, err := LintFile(context.Background(), file, newFake(), LintOptions{}); err == nil || !strings.HasPrefix(err.Error(), file+": ") {
		t.Errorf("bad YAML: %v", err)
	}
}
