package termsafe

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// hasRawControl reports whether s holds a byte or character that a
// terminal would act on or that is not valid UTF-8.
func hasRawControl(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			return true
		}
	}
	return false
}

func TestName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"model.safetensors", "model.safetensors"},
		{"dir/sub file-ü-日本.bin", "dir/sub file-ü-日本.bin"},
		{"a\x1b]0;pwned\x07b", `"a\x1b]0;pwned\ab"`},
		{"x\x1b[2Jy", `"x\x1b[2Jy"`},
		{"line\nforged: ok", `"line\nforged: ok"`},
		{"cr\rover", `"cr\rover"`},
		{"tab\tname", `"tab\tname"`},
		{"del\x7f", `"del\x7f"`},
		{"c1\u009bcsi", `"c1\u009bcsi"`},
		{"c1 raw \xc2\x9b", `"c1 raw \u009b"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
		{"rlo\u202etxt.exe", `"rlo\u202etxt.exe"`},
		{"isolate\u2066x\u2069", `"isolate\u2066x\u2069"`},
		{"zero\u200bwidth", `"zero\u200bwidth"`},
		{"sep\u2028line", `"sep\u2028line"`},
		{`"quoted"`, `"\"quoted\""`},
		{`mid"quote`, `mid"quote`},
		{"", ""},
	} {
		got := Name(tc.in)
		if got != tc.want {
			t.Errorf("Name(%q) = %s, want %s", tc.in, got, tc.want)
		}
		if hasRawControl(got) {
			t.Errorf("Name(%q) = %q still holds a control character", tc.in, got)
		}
	}
}

func TestNames(t *testing.T) {
	got := Names([]string{"v1", "p\x1bwn"})
	if got[0] != "v1" || got[1] != `"p\x1bwn"` {
		t.Fatalf("Names = %q", got)
	}
}

func TestShort(t *testing.T) {
	if got := Short("a\x1bb"); got != `"a\x1bb"` {
		t.Fatalf("Short of a short string = %s", got)
	}
	long := strings.Repeat("../", 1700) + "x"
	got := Short(long)
	if !strings.HasSuffix(got, "…(5101 bytes)") || len(got) > ShortBytes+40 || !strings.HasPrefix(got, `"../../`) {
		t.Fatalf("Short of %d bytes = %s", len(long), got)
	}
	// A cut never splits a character.
	wide := strings.Repeat("日", 100)
	got = Short(wide)
	if !utf8.ValidString(got) || strings.Contains(got, `\x`) {
		t.Fatalf("Short split a character: %s", got)
	}
	if hasRawControl(Short(strings.Repeat("\x1b", 500))) {
		t.Fatal("Short kept a raw ESC")
	}
}

func TestText(t *testing.T) {
	in := "pull: a\x1b]0;pwned\x07b at 3: \u202ehi\xff\nsecond line\tend"
	want := `pull: a\x1b]0;pwned\ab at 3: \u202ehi\xff` + "\nsecond line\tend"
	if got := Text(in); got != want {
		t.Fatalf("Text = %q, want %q", got, want)
	}
	if got := Text("plain\nerror"); got != "plain\nerror" {
		t.Fatalf("Text changed a safe message: %q", got)
	}
}

type tagName string

func TestShortArgs(t *testing.T) {
	long := strings.Repeat("a", 5000)
	got := fmt.Sprintf("symlink %q: bad target %q (%d), %s", ShortArgs("l", tagName(long), 7, "plain")...)
	want := `symlink "l": bad target "` + strings.Repeat("a", ShortBytes) + `"…(5000 bytes) (7), plain`
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	if got := fmt.Sprintf("%q", ShortArgs("a\x1bb")...); got != `"a\x1bb"` {
		t.Fatalf("short %%q = %s", got)
	}
}
