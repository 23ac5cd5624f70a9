package retention

import (
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestRestorable(t *testing.T) {
	a, b, c := digest.FromString("a"), digest.FromString("b"), digest.FromString("c")
	got := Restorable([]Deleted{{Digest: a}, {Digest: b, Live: true}, {Digest: a}, {Digest: c, Gone: true}})
	if len(got) != 1 || got[0].Digest != a {
		t.Errorf("restorable %+v, want a once", got)
	}
	if got := Restorable(nil); got == nil {
		t.Error("Restorable(nil) is nil; want an empty list (JSON [])")
	}
}
