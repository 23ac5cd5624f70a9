package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/opencontainers/go-digest"
	"gopkg.in/yaml.v3"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// SourceKey is the mapping key whose string values are volume references.
const SourceKey = "source"

// CSIDriver is the name of bdnvol's CSI driver: in a Kubernetes csi: volume
// source of this driver, volumeAttributes.ref (or, without it, volumeHandle)
// is a volume reference.
const CSIDriver = "csi.bdnvol.dev"

// Candidate is a string scalar of a document that may be a volume reference.
type Candidate struct {
	Value  string
	Line   int  // 1-based line of the value
	Column int  // 1-based column (in characters) of the node
	Offset int  // byte offset of Value in the file; -1 if it cannot be located
	Source bool // a volume reference by definition: a source: value or a bdnvol CSI volume's reference
}

// Find returns the candidates of every document of a YAML or JSON file, in
// file order: the string values of source: keys, the references of
// Kubernetes csi: volumes of the bdnvol driver (volumeAttributes.ref, else
// volumeHandle), and with all every other string scalar that parses as a
// reference with a tag or a digest.
func Find(b []byte, all bool) ([]Candidate, error) {
	lines := lineStarts(b)
	var out []Candidate
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		w := walker{all: all, refs: map[*yaml.Node]bool{}, f: func(n *yaml.Node, source bool) {
			out = append(out, Candidate{
				Value: n.Value, Line: n.Line, Column: n.Column, Source: source,
				Offset: locate(b, lines, n),
			})
		}}
		w.walk(&doc, false, "")
	}
	return out, nil
}

// walker visits the scalars of one document in order.
type walker struct {
	all  bool
	refs map[*yaml.Node]bool // value nodes that are references by their place in a CSI volume
	f    func(n *yaml.Node, source bool)
}

// walk visits n, the value of the mapping key key ("" inside sequences and
// at the top), which is a source: value when source is set.
func (w *walker) walk(n *yaml.Node, source bool, key string) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			w.walk(c, false, "")
		}
	case yaml.MappingNode:
		if key == "csi" {
			if ref := csiRef(n); ref != nil {
				w.refs[ref] = true
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				w.walk(v, false, "")
				continue
			}
			w.walk(v, k.Value == SourceKey || w.refs[v], k.Value)
		}
	case yaml.ScalarNode:
		if n.ShortTag() != "!!str" {
			return
		}
		if source {
			w.f(n, true)
		} else if w.all {
			if r, err := oci.ParseRef(n.Value); err == nil && r.Reference() != "" {
				w.f(n, false)
			}
		}
	}
}

// csiRef returns the node of the volume reference of m, a Kubernetes CSI
// volume source (a pod's inline csi: volume or a PersistentVolume's
// spec.csi), or nil unless its driver is CSIDriver: volumeAttributes.ref
// when the attribute is there, else volumeHandle.
func csiRef(m *yaml.Node) *yaml.Node {
	driver := lookup(m, "driver")
	if driver == nil || driver.Kind != yaml.ScalarNode || driver.Value != CSIDriver {
		return nil
	}
	if attrs := lookup(m, "volumeAttributes"); attrs != nil && attrs.Kind == yaml.MappingNode {
		if ref := lookup(attrs, "ref"); ref != nil {
			return ref
		}
	}
	return lookup(m, "volumeHandle")
}

// lookup returns the value of key in the mapping m, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := m.Content[i]; k.Kind == yaml.ScalarNode && k.Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func lineStarts(b []byte) []int {
	starts := []int{0}
	for i, c := range b {
		if c == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

// locate returns the byte offset of the scalar n's value in b, or -1 when
// the text there is not the value verbatim (escapes, block scalars).
func locate(b []byte, lines []int, n *yaml.Node) int {
	if n.Line < 1 || n.Line > len(lines) || n.Value == "" || strings.ContainsAny(n.Value, "\n\r") {
		return -1
	}
	if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return -1
	}
	start := lines[n.Line-1]
	end := len(b)
	if n.Line < len(lines) {
		end = lines[n.Line] - 1
	}
	line := b[start:end]
	off := 0
	for col := 1; col < n.Column && off < len(line); col++ {
		_, w := utf8.DecodeRune(line[off:])
		off += w
	}
	// An anchor or a tag may stand between the node's position and its value.
	i := bytes.Index(line[off:], []byte(n.Value))
	if i < 0 {
		return -1
	}
	pos := off + i
	after := byte(' ')
	if pos+len(n.Value) < len(line) {
		after = line[pos+len(n.Value)]
	}
	switch {
	case n.Style&yaml.DoubleQuotedStyle != 0:
		if pos == 0 || line[pos-1] != '"' || after != '"' {
			return -1
		}
	case n.Style&yaml.SingleQuotedStyle != 0:
		if pos == 0 || line[pos-1] != '\'' || after != '\'' {
			return -1
		}
	default:
		if !strings.ContainsRune(" \t\r,]}#", rune(after)) {
			return -1
		}
	}
	return start + pos
}

// Resolver answers what pin and lint need to know about references.
type Resolver interface {
	// Resolve returns the digest of the version ref names: its digest if it
	// has one (checked to exist), else its tag's target. Errors wrap
	// oci.ErrNotFound when nothing is there and layout.ErrNotVolume when it
	// is not a bdnvol volume.
	Resolve(ctx context.Context, ref oci.Ref) (digest.Digest, error)
	// HasVolumes reports whether ref's repository holds sealed versions.
	HasVolumes(ctx context.Context, ref oci.Ref) (bool, error)
}

// Change is one rewrite that Pin made.
type Change struct {
	Line int
	Old  string
	New  string
}

// PinOptions configure Pin.
type PinOptions struct {
	All    bool // also pin any string that resolves to a volume, not only source: values
	Update bool // re-pin references whose tag has moved since they were pinned
}

// RefError is a volume reference that pin or lint could not use.
type RefError struct {
	Line int
	Ref  string
	Err  error
}

// Error names the line, the reference and the cause.
func (e *RefError) Error() string { return fmt.Sprintf("line %d: %s: %v", e.Line, e.Ref, e.Err) }

// Unwrap returns the cause.
func (e *RefError) Unwrap() error { return e.Err }

// Pin rewrites, in the YAML or JSON file b, every volume reference that
// uses only a tag into REPO:TAG@sha256:<hex>, changing nothing else byte for
// byte. It returns the new bytes and the changes; the errors (one
// *RefError per reference it could not pin, joined) leave those references
// as they were.
func Pin(ctx context.Context, b []byte, res Resolver, opt PinOptions) ([]byte, []Change, error) {
	cands, err := Find(b, opt.All)
	if err != nil {
		return nil, nil, err
	}
	type edit struct {
		off    int
		old    string
		new    string
		line   int
		source bool
	}
	var edits []edit
	var errs []error
	fail := func(c Candidate, err error) {
		if c.Source {
			errs = append(errs, &RefError{Line: c.Line, Ref: c.Value, Err: err})
		}
	}
	for _, c := range cands {
		r, err := oci.ParseRef(c.Value)
		if err != nil {
			fail(c, err)
			continue
		}
		if r.Tag == "" && r.Digest == "" {
			fail(c, errors.New("no tag or digest"))
			continue
		}
		if r.Tag == "" || r.Digest != "" && !opt.Update {
			continue // pinned
		}
		tagRef := r
		tagRef.Digest = ""
		d, _, err := resolveAny(ctx, res, tagRef)
		if err != nil {
			fail(c, err)
			continue
		}
		if d == r.Digest {
			continue
		}
		if c.Offset < 0 {
			fail(c, errors.New("cannot rewrite this scalar in place (block or escaped string); write it as a plain or quoted string"))
			continue
		}
		base, _, _ := strings.Cut(c.Value, "@")
		edits = append(edits, edit{off: c.Offset, old: c.Value, new: base + "@" + d.String(), line: c.Line})
	}
	out := b
	var changes []Change
	if len(edits) > 0 {
		var buf bytes.Buffer
		last := 0
		for _, e := range edits {
			buf.Write(b[last:e.off])
			buf.WriteString(e.new)
			last = e.off + len(e.old)
			changes = append(changes, Change{Line: e.line, Old: e.old, New: e.new})
		}
		buf.Write(b[last:])
		out = buf.Bytes()
	}
	return out, changes, errors.Join(errs...)
}

// Finding is one problem lint found.
type Finding struct {
	File   string `json:"file,omitempty"` // set by LintFile
	Line   int    `json:"line"`
	Ref    string `json:"reference"`
	Reason string `json:"reason"`
}

// LintOptions configure Lint.
type LintOptions struct {
	All bool // also check any string that names a volume, not only source: values
}

// Lint checks every volume reference of the YAML or JSON file b: it must be
// pinned to a digest, the digest must exist and be a volume, and a tag next
// to the digest must still point at it. With All, strings outside source:
// keys count only when they resolve to a volume, or when they do not
// resolve but their repository holds volumes.
func Lint(ctx context.Context, b []byte, res Resolver, opt LintOptions) ([]Finding, error) {
	cands, err := Find(b, opt.All)
	if err != nil {
		return nil, err
	}
	var out []Finding
	type view struct {
		c      Candidate
		volume digest.Digest
	}
	var views []view
	var pinned []oci.Ref // the volume references pinned to a digest
	for _, c := range cands {
		add := func(format string, a ...any) {
			out = append(out, Finding{Line: c.Line, Ref: c.Value, Reason: fmt.Sprintf(format, a...)})
		}
		r, err := oci.ParseRef(c.Value)
		if err != nil {
			if c.Source {
				add("invalid reference: %v", err)
			}
			continue
		}
		if r.Reference() == "" {
			if c.Source {
				add("no tag or digest")
			}
			continue
		}
		d, volume, err := resolveAny(ctx, res, r)
		if volume != "" {
			views = append(views, view{c, volume})
		} else if err == nil && r.Digest != "" {
			pinned = append(pinned, r)
		}
		if err != nil {
			if !c.Source && !errors.Is(err, layout.ErrNotVolume) {
				if has, herr := res.HasVolumes(ctx, r); herr == nil && has {
					c.Source = true // a volume repository: the reference is ours
				}
			}
			if !c.Source {
				continue
			}
			switch {
			case errors.Is(err, layout.ErrNotVolume):
				add("not a bdnvol volume")
			case errors.Is(err, oci.ErrNotFound) && r.Digest != "":
				add("digest %s does not exist (deleted?)", r.Digest)
			case errors.Is(err, oci.ErrNotFound):
				add("tag %s does not exist", r.Tag)
			default:
				add("does not resolve: %v", err)
			}
			continue
		}
		if r.Digest == "" {
			add("not pinned to a digest (%s points at %s now)", r.Tag, d)
			continue
		}
		if r.Tag == "" {
			continue
		}
		tagRef := r
		tagRef.Digest = ""
		now, _, err := resolveAny(ctx, res, tagRef)
		switch {
		case errors.Is(err, oci.ErrNotFound):
			// The tag is gone; the pinned digest still exists and is what runs.
		case err != nil:
			add("tag %s does not resolve: %v", r.Tag, err)
		case now != r.Digest:
			add("%s moved since this was pinned: it points at %s now", r.Tag, now)
		}
	}
	for _, v := range views {
		if why := viewFinding(ctx, res, v.volume, pinned); why != "" {
			out = append(out, Finding{Line: v.c.Line, Ref: v.c.Value, Reason: why})
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int { return a.Line - b.Line })
	return out, nil
}
