package versions

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestReadTagHistoryCurrentMovesAndOutsideMoves(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	ref := oci.Ref{Layout: "/vol", Tag: "main"}
	v1, err := publishTree(t, tg, map[string][]byte{"a": []byte("one")}, PublishOptions{Tag: "main"})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := publishTree(t, tg, map[string][]byte{"a": []byte("two")}, PublishOptions{Tag: "main"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ReadTagHistory(ctx, tg, ref)
	if err != nil {
		t.Fatal(err)
	}
	if h.Tag != "main" || h.Current != v2.Root.Digest || len(h.Moves) != 2 || h.Moves[0].Digest != v1.Root.Digest || h.MovedOutside() {
		t.Fatalf("history %+v", h)
	}
	// Moved back by hand, without bdnvol: no move recorded for it.
	if err := tg.Tag(ctx, v1.Root, "main"); err != nil {
		t.Fatal(err)
	}
	h, err = ReadTagHistory(ctx, tg, ref)
	if err != nil || h.Current != v1.Root.Digest || len(h.Moves) != 2 || !h.MovedOutside() {
		t.Fatalf("after a move outside bdnvol: %+v, %v", h, err)
	}
	// A tag that never existed.
	_, err = ReadTagHistory(ctx, tg, oci.Ref{Layout: "/vol", Tag: "nope"})
	if !errors.Is(err, oci.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing tag: %v", err)
	}
	// A tag that is gone keeps its history; it is not moved outside.
	gone := &TagHistory{Tag: "x", Moves: h.Moves}
	if gone.MovedOutside() {
		t.Error("a deleted tag reads as moved outside bdnvol")
	}
}
