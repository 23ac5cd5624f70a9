package byterange

import "testing"

func TestHeaderAndStart(t *testing.T) {
	if got := Header(10, 5); got != "bytes=10-14" {
		t.Fatalf("Header(10, 5) = %q", got)
	}
	for in, want := range map[string]int64{"bytes 10-14/100": 10, "bytes 0-0/*": 0} {
		if got, ok := Start(in); !ok || got != want {
			t.Errorf("Start(%q) = %d, %v", in, got, ok)
		}
	}
	for _, bad := range []string{"", "bytes */100", "items 1-2/3", "bytes x-2/3"} {
		if _, ok := Start(bad); ok {
			t.Errorf("Start(%q) accepted", bad)
		}
	}
}
