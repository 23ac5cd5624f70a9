package layout

import "testing"

func TestParamsCompleted(t *testing.T) {
	for _, c := range []struct{ in, want Params }{
		{Params{}, Params{}},
		{Params{Avg: 64 << 10}, Params{Min: 16 << 10, Avg: 64 << 10, Max: 16 << 20}},
		{Params{Min: 512 << 10, Avg: 1 << 20, Max: 4 << 20}, Params{Min: 512 << 10, Avg: 1 << 20, Max: 4 << 20}},
		{Params{Min: 32 << 20}, Params{Min: 32 << 20, Avg: 32 << 20, Max: 64 << 20}},
	} {
		got, err := c.in.Completed()
		if err != nil || got != c.want {
			t.Errorf("%+v completed: %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	// Min above max; and max alone leaves min at 0 (avg is derived after
	// min), as the CLI always did.
	for _, bad := range []Params{{Min: 8 << 20, Max: 1 << 20}, {Max: 4 << 20}} {
		if _, err := bad.Completed(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// v1Params are DefaultParams as format version 1 records them (no pack size).
var v1Params = Params{Min: DefaultParams.Min, Avg: DefaultParams.Avg, Max: DefaultParams.Max}

// expand turns an opened index into its expanded form, for tests that
// change its entries.
func expand(x *Index) {
	x.Files = x.AllFiles()
}
