// Package termsafe makes strings that come from a volume or a registry
// (paths, symlink targets, tags, annotations) safe to print for a human:
// escape sequences in them must not reach the terminal, where they could
// retitle the window, clear the screen, reorder text or forge lines.
package termsafe

import (
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ShortBytes is how much of a long string Short keeps.
const ShortBytes = 96

// Safe reports whether s prints as itself: valid UTF-8 with only printable
// characters (strconv.IsPrint: no C0 or C1 control, DEL, bidirectional
// override or isolate, zero-width or line-separator character).
func Safe(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !strconv.IsPrint(r) {
			return false
		}
		i += n
	}
	return true
}

// Name returns s unchanged when it is Safe and does not start with a double
// quote, and strconv.Quote(s) otherwise, so that a quoted name is never
// mistaken for a plain one. Use it for every volume-derived string in human
// output; JSON output escapes by itself.
func Name(s string) string {
	if Safe(s) && !strings.HasPrefix(s, `"`) {
		return s
	}
	return strconv.Quote(s)
}

// Names applies Name to each of ss.
func Names(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = Name(s)
	}
	return out
}

// Short returns s quoted (strconv.Quote), cut after its first ShortBytes
// bytes (at a character boundary) and followed by "…(N bytes)" when it is
// longer, for error messages that name a long path or symlink target.
func Short(s string) string {
	if len(s) <= ShortBytes {
		return strconv.Quote(s)
	}
	cut := ShortBytes
	for cut > ShortBytes-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// Text returns s with every character that is not Safe written as its Go
// escape (\x1b, \u202e, \x80 for a byte of invalid UTF-8), keeping newlines
// and tabs: for messages, such as errors, that may echo volume-derived
// strings unquoted.
func Text(s string) string {
	if Safe(strings.NewReplacer("\n", "", "\t", "").Replace(s)) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case r < 0x20 || r == 0x7f || !strconv.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Long is a string that prints shortened: under %q as Short does, under
// other verbs as itself.
type Long string

// Format implements fmt.Formatter.
func (s Long) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		io.WriteString(f, Short(string(s)))
		return
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), string(s))
}

// ShortArgs returns args with every argument of a string kind (string,
// digest.Digest and the like) made a Long, so that an error message built
// with %q from untrusted strings stays short.
func ShortArgs(args ...any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if v := reflect.ValueOf(a); v.IsValid() && v.Kind() == reflect.String {
			a = Long(v.String())
		}
		out[i] = a
	}
	return out
}
