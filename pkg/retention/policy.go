package retention

import (
	"cmp"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/versions"
)

// Deleted is a soft-deleted version: one tombstone and what it records.
type Deleted struct {
	Digest    digest.Digest      `json:"digest"`  // the deleted version
	Deleted   time.Time          `json:"deleted"` // when it was deleted
	Sealed    time.Time          `json:"sealed"`  // when it was first sealed
	Tags      []string           `json:"tags"`    // human tags it had
	Bytes     int64              `json:"bytes"`
	Files     int                `json:"files"`
	Tag       string             `json:"tombstone_tag"`
	Tombstone ocispec.Descriptor `json:"tombstone"`
	Root      ocispec.Descriptor `json:"-"` // the version's root, as the tombstone names it
	Live      bool               `json:"-"` // sealed again since (restored or re-pushed)
	Gone      bool               `json:"-"` // its root no longer exists (a purge was cut short)
}

// Reference is one place that names a version of the repository.
type Reference struct {
	Source string        `json:"source"`           // FILE:LINE, stdin:LINE, or the mount point
	Ref    string        `json:"reference"`        // as written
	Digest digest.Digest `json:"digest,omitempty"` // empty for a tag-only reference
	Tag    string        `json:"tag,omitempty"`
	Mount  bool          `json:"mount,omitempty"` // a bdnvol mount running on this machine
	// WarmstateKey is the key of a warm-state volume (a CSI volume's
	// warmstateKey beside its ref): the companions it uses.
	WarmstateKey string `json:"warmstate_key,omitempty"`
}

// Policy says which versions to keep. The zero value keeps nothing but
// referenced and mounted versions.
type Policy struct {
	KeepLast   int           // keep the newest N versions
	KeepTags   []string      // keep versions with a human tag matching one of these globs (path.Match)
	KeepWithin time.Duration // keep versions sealed less than this long ago; 0: none
	// Purge plans the real deletion of tombstones older than RestoreWindow.
	Purge         bool
	RestoreWindow time.Duration
}

// Validate checks the globs.
func (p Policy) Validate() error {
	for _, g := range p.KeepTags {
		if _, err := path.Match(g, ""); err != nil {
			return fmt.Errorf("keep-tag %q: %w", g, err)
		}
	}
	if p.KeepLast < 0 || p.KeepWithin < 0 || p.RestoreWindow < 0 {
		return fmt.Errorf("negative retention setting")
	}
	return nil
}

// Action is what a plan does with a version or a tombstone.
type Action string

// Actions.
const (
	ActionKeep   Action = "keep"
	ActionDelete Action = "delete" // soft delete: tombstone, restorable
	ActionPurge  Action = "purge"  // delete a tombstoned version for real
)

// Reason kinds.
const (
	ReasonTagged     = "tagged"
	ReasonNewest     = "newest"
	ReasonReferenced = "referenced"
	ReasonMounted    = "mounted"
	ReasonRecent     = "recent"
	ReasonUnused     = "unused"
	ReasonRestorable = "restorable"
	ReasonExpired    = "expired"
)

// Reason is one reason for an action.
type Reason struct {
	Kind string `json:"kind"`
	Text string `json:"text"`
}

// String returns the text.
func (r Reason) String() string { return r.Text }

// Decision is what the plan does with one version or tombstone.
type Decision struct {
	Digest  digest.Digest `json:"digest"`
	Sealed  time.Time     `json:"sealed"`
	Deleted time.Time     `json:"deleted,omitzero"` // tombstones only
	Tags    []string      `json:"tags"`             // human tags now; for a tombstone, the former ones
	Action  Action        `json:"action"`
	Reasons []Reason      `json:"reasons"`
	Record  *Deleted      `json:"-"` // the tombstone, for tombstones
}

// Why joins the reasons.
func (d Decision) Why() string {
	s := make([]string, len(d.Reasons))
	for i, r := range d.Reasons {
		s[i] = r.Text
	}
	return strings.Join(s, "; ")
}

// Warning is a reference the plan could not match to a live version.
type Warning struct {
	Source string        `json:"source"`
	Ref    string        `json:"reference"`
	Digest digest.Digest `json:"digest"`
	Text   string        `json:"text"`
}

// String formats SOURCE: REF: TEXT.
func (w Warning) String() string { return w.Source + ": " + w.Ref + ": " + w.Text }

// Input is the snapshot a plan is made from.
type Input struct {
	Versions   []versions.Version
	Deleted    []Deleted
	References []Reference
	Now        time.Time // zero: time.Now()
}

// Plan is every version and tombstone with what to do and why.
type Plan struct {
	Now      time.Time  `json:"now"`
	Policy   Policy     `json:"-"`
	Versions []Decision `json:"versions"` // newest first
	Deleted  []Decision `json:"deleted"`  // tombstones, oldest deletion first; only with Policy.Purge
	Warnings []Warning  `json:"warnings"`
}

// NewPlan decides, for every version of in, KEEP or DELETE, and with
// p.Purge, for every tombstone, PURGE or KEEP. A version is kept when any
// rule keeps it; a referenced or mounted version is always kept, and so is a
// tombstone whose version something still references.
func NewPlan(in Input, p Policy) (*Plan, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	vs := slices.Clone(in.Versions)
	slices.SortStableFunc(vs, func(a, b versions.Version) int {
		if c := b.Sealed.Compare(a.Sealed); c != 0 {
			return c
		}
		return cmp.Compare(b.Digest, a.Digest)
	})
	plan := &Plan{Now: now, Policy: p, Versions: []Decision{}, Deleted: []Decision{}, Warnings: []Warning{}}
	live := map[digest.Digest]bool{}
	for i, v := range vs {
		live[v.Digest] = true
		reasons := KeepReasons(v, in.References, p)
		if i < p.KeepLast {
			reasons = append(reasons, Reason{ReasonNewest, fmt.Sprintf("newest %d", p.KeepLast)})
		}
		if p.KeepWithin > 0 && now.Sub(v.Sealed) < p.KeepWithin {
			reasons = append(reasons, Reason{ReasonRecent, "pushed within " + FormatDuration(p.KeepWithin)})
		}
		d := Decision{Digest: v.Digest, Sealed: v.Sealed, Tags: nonNil(v.Tags), Action: ActionKeep, Reasons: reasons}
		if len(reasons) == 0 {
			d.Action = ActionDelete
			text := "not tagged, referenced or mounted"
			if p.KeepLast > 0 {
				text += fmt.Sprintf("; older than the newest %d", p.KeepLast)
			}
			if p.KeepWithin > 0 {
				text += "; pushed more than " + FormatDuration(p.KeepWithin) + " ago"
			}
			d.Reasons = []Reason{{ReasonUnused, text}}
		}
		plan.Versions = append(plan.Versions, d)
	}
	deleted := map[digest.Digest]*Deleted{}
	for i := range in.Deleted {
		if r := &in.Deleted[i]; !r.Live && !r.Gone {
			deleted[r.Digest] = r
		}
	}
	liveTags := map[string]bool{}
	for _, v := range vs {
		for _, tag := range v.Tags {
			liveTags[tag] = true
		}
	}
	for _, r := range in.References {
		if r.Mount || r.Digest == "" && (r.Tag == "" || liveTags[r.Tag]) || r.Digest != "" && live[r.Digest] {
			continue
		}
		w := Warning{Source: r.Source, Ref: r.Ref, Digest: r.Digest}
		if r.Digest == "" {
			w.Text = "tag " + r.Tag + " names no version of this repository (deleted?): new replicas will fail to start"
		} else if d, ok := deleted[r.Digest]; ok {
			w.Text = fmt.Sprintf("names a version deleted at %s: new replicas will fail to start until it is restored (bdnvol restore)", d.Deleted.UTC().Format(time.RFC3339))
		} else {
			w.Text = "names a digest this repository does not have as a version (deleted?): new replicas will fail to start"
		}
		plan.Warnings = append(plan.Warnings, w)
	}
	if !p.Purge {
		return plan, nil
	}
	ts := slices.Clone(in.Deleted)
	slices.SortStableFunc(ts, func(a, b Deleted) int { return a.Deleted.Compare(b.Deleted) })
	for i := range ts {
		r := &ts[i]
		if r.Live {
			continue // restored or re-pushed: not deleted any more
		}
		d := Decision{Digest: r.Digest, Sealed: r.Sealed, Deleted: r.Deleted, Tags: nonNil(r.Tags), Record: r}
		d.Reasons = KeepReasons(versions.Version{Digest: r.Digest}, in.References, Policy{})
		switch {
		case len(d.Reasons) > 0:
			d.Action = ActionKeep
		case now.Sub(r.Deleted) < p.RestoreWindow:
			d.Action = ActionKeep
			d.Reasons = []Reason{{ReasonRestorable, "restorable until " + r.Deleted.Add(p.RestoreWindow).UTC().Format(time.RFC3339)}}
		default:
			d.Action = ActionPurge
			d.Reasons = []Reason{{ReasonExpired, "deleted more than " + FormatDuration(p.RestoreWindow) + " ago"}}
		}
		plan.Deleted = append(plan.Deleted, d)
	}
	return plan, nil
}

// KeepReasons returns the reasons that keep v whatever its age: a human tag
// matching p.KeepTags, a reference to its digest (or to one of its tags),
// a running mount of it.
func KeepReasons(v versions.Version, refs []Reference, p Policy) []Reason {
	reasons := []Reason{}
	for _, tag := range v.Tags {
		for _, g := range p.KeepTags {
			if ok, _ := path.Match(g, tag); ok {
				reasons = append(reasons, Reason{ReasonTagged, "tagged " + tag})
				break
			}
		}
	}
	seen := map[string]bool{}
	for _, r := range refs {
		var why Reason
		switch {
		case r.Mount && r.Digest == v.Digest:
			why = Reason{ReasonMounted, "running mount on this machine (" + r.Source + ")"}
		case r.Mount:
			continue
		case r.Digest == v.Digest:
			why = Reason{ReasonReferenced, "referenced by " + r.Source}
		case r.Digest == "" && r.Tag != "" && slices.Contains(v.Tags, r.Tag):
			why = Reason{ReasonReferenced, "referenced by " + r.Source + " (tag " + r.Tag + ")"}
		default:
			continue
		}
		if !seen[why.Text] {
			seen[why.Text] = true
			reasons = append(reasons, why)
		}
	}
	return reasons
}

// Duration is a time.Duration that parses as ParseDuration does ("7d"):
// a flag's type.
type Duration time.Duration

// UnmarshalText parses 7d, 36h, 1d12h, 0s.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// FormatDuration writes whole days as "7d" and anything else as
// time.Duration does.
func FormatDuration(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// ParseDuration parses a time.Duration, also accepting a number of days
// ("7d") and combinations such as "1d12h".
func ParseDuration(s string) (time.Duration, error) {
	in := s
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		var n int64
		if _, err := fmt.Sscanf(s[:i], "%d", &n); err != nil || fmt.Sprint(n) != s[:i] || n < 0 {
			return 0, fmt.Errorf("bad duration %q", s)
		}
		if n > math.MaxInt64/int64(24*time.Hour) {
			return 0, fmt.Errorf("duration %q is too long (at most %dd)", s, math.MaxInt64/int64(24*time.Hour))
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	if d > 0 && days > math.MaxInt64-d {
		return 0, fmt.Errorf("duration %q is too long", in)
	}
	return days + d, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
