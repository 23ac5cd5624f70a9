package retention

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/versions"
)

var now = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// six returns versions v1..v6 sealed a day apart, v6 newest, with digests
// named after them; prod is on v5.
func six() ([]versions.Version, map[string]digest.Digest) {
	ds := map[string]digest.Digest{}
	var vs []versions.Version
	for i := 1; i <= 6; i++ {
		name := fmt.Sprintf("v%d", i)
		ds[name] = digest.FromString(name)
		v := versions.Version{Digest: ds[name], Sealed: now.Add(-time.Duration(7-i) * 24 * time.Hour)}
		if i == 5 {
			v.Tags = []string{"prod"}
		}
		vs = append(vs, v)
	}
	return vs, ds
}

func TestNewPlan(t *testing.T) {
	vs, ds := six()
	ref := func(v, src string) Reference {
		return Reference{Source: src, Ref: "r/x@" + ds[v].String(), Digest: ds[v]}
	}
	cases := []struct {
		name    string
		policy  Policy
		refs    []Reference
		deleted []string            // versions planned for DELETE
		reasons map[string][]string // version -> reason kinds, in order
	}{
		{
			name:    "keep-last 2, tags, a deploy reference",
			policy:  Policy{KeepLast: 2, KeepTags: []string{"*"}},
			refs:    []Reference{ref("v2", "deploy/llama.yaml:12")},
			deleted: []string{"v1", "v3", "v4"},
			reasons: map[string][]string{
				"v6": {ReasonNewest}, "v5": {ReasonTagged, ReasonNewest}, "v4": {ReasonUnused},
				"v2": {ReasonReferenced}, "v1": {ReasonUnused},
			},
		},
		{
			name:    "nothing kept but references and mounts",
			policy:  Policy{},
			refs:    []Reference{ref("v2", "a.yaml:1"), {Source: "/mnt/llama", Digest: ds["v4"], Mount: true}},
			deleted: []string{"v1", "v3", "v5", "v6"},
			reasons: map[string][]string{"v4": {ReasonMounted}, "v2": {ReasonReferenced}},
		},
		{
			name:    "keep-within and a tag glob that does not match",
			policy:  Policy{KeepWithin: 50 * time.Hour, KeepTags: []string{"release-*"}},
			deleted: []string{"v1", "v2", "v3", "v4"},
			reasons: map[string][]string{"v6": {ReasonRecent}, "v5": {ReasonRecent}},
		},
		{
			name:    "a tag-only reference keeps what the tag points at",
			policy:  Policy{KeepLast: 1},
			refs:    []Reference{{Source: "values.yaml:3", Ref: "r/x:prod", Tag: "prod"}},
			deleted: []string{"v1", "v2", "v3", "v4"},
			reasons: map[string][]string{"v5": {ReasonReferenced}},
		},
		{
			name:    "two references to one version, one reason each",
			policy:  Policy{KeepLast: 6},
			refs:    []Reference{ref("v1", "a.yaml:1"), ref("v1", "a.yaml:1"), ref("v1", "b.json:9")},
			reasons: map[string][]string{"v1": {ReasonReferenced, ReasonReferenced, ReasonNewest}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Input order must not matter.
			in := slices.Clone(vs)
			slices.Reverse(in)
			p, err := NewPlan(Input{Versions: in, References: c.refs, Now: now}, c.policy)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Versions) != 6 || p.Versions[0].Digest != ds["v6"] || p.Versions[5].Digest != ds["v1"] {
				t.Fatalf("plan not newest first: %+v", p.Versions)
			}
			var got []string
			for i, d := range p.Versions {
				name := fmt.Sprintf("v%d", 6-i)
				if d.Action == ActionDelete {
					got = append(got, name)
				}
				if len(d.Reasons) == 0 {
					t.Errorf("%s: no reason", name)
				}
				if want, ok := c.reasons[name]; ok {
					var kinds []string
					for _, r := range d.Reasons {
						kinds = append(kinds, r.Kind)
					}
					if !slices.Equal(kinds, want) {
						t.Errorf("%s: reasons %v (%s), want %v", name, kinds, d.Why(), want)
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, c.deleted) {
				t.Errorf("deleted %v, want %v", got, c.deleted)
			}
			if len(p.Warnings) != 0 || len(p.Deleted) != 0 {
				t.Errorf("warnings %v, tombstones %v", p.Warnings, p.Deleted)
			}
		})
	}
}

func TestNewPlanReasonTexts(t *testing.T) {
	vs, ds := six()
	p, err := NewPlan(Input{Versions: vs, Now: now, References: []Reference{
		{Source: "deploy/llama.yaml:12", Digest: ds["v2"]},
		{Source: "/mnt/m", Digest: ds["v3"], Mount: true},
	}}, Policy{KeepLast: 3, KeepTags: []string{"prod"}, KeepWithin: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	want := map[digest.Digest]string{
		ds["v5"]: "tagged prod; newest 3; pushed within 7d",
		ds["v2"]: "referenced by deploy/llama.yaml:12; pushed within 7d",
		ds["v3"]: "running mount on this machine (/mnt/m); pushed within 7d",
	}
	for _, d := range p.Versions {
		if w, ok := want[d.Digest]; ok && d.Why() != w {
			t.Errorf("%s: %q, want %q", d.Digest, d.Why(), w)
		}
	}
	p, _ = NewPlan(Input{Versions: vs, Now: now}, Policy{KeepLast: 3, KeepWithin: 48 * time.Hour})
	if w := "not tagged, referenced or mounted; older than the newest 3; pushed more than 2d ago"; p.Versions[5].Why() != w {
		t.Errorf("delete reason %q, want %q", p.Versions[5].Why(), w)
	}
}

func TestNewPlanWarningsAndPurge(t *testing.T) {
	vs, ds := six()
	gone := digest.FromString("gone")
	old := Deleted{Digest: digest.FromString("old"), Deleted: now.Add(-8 * 24 * time.Hour), Tag: "deleted-old"}
	recent := Deleted{Digest: digest.FromString("recent"), Deleted: now.Add(-time.Hour), Tag: "deleted-recent"}
	pinned := Deleted{Digest: digest.FromString("pinned"), Deleted: now.Add(-30 * 24 * time.Hour), Tag: "deleted-pinned"}
	live := Deleted{Digest: ds["v1"], Deleted: now.Add(-30 * 24 * time.Hour), Tag: "deleted-v1", Live: true}
	refs := []Reference{
		{Source: "a.yaml:1", Ref: "r/x@" + gone.String(), Digest: gone},
		{Source: "a.yaml:2", Ref: "r/x@" + pinned.Digest.String(), Digest: pinned.Digest},
		{Source: "a.yaml:3", Ref: "r/x:nope", Tag: "nope"},
	}
	in := Input{Versions: vs, Deleted: []Deleted{recent, pinned, old, live}, References: refs, Now: now}
	p, err := NewPlan(in, Policy{KeepLast: 10, Purge: true, RestoreWindow: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != 3 || p.Warnings[0].Digest != gone || !strings.Contains(p.Warnings[0].Text, "does not have") ||
		p.Warnings[1].Digest != pinned.Digest || !strings.Contains(p.Warnings[1].Text, "deleted at") ||
		!strings.HasPrefix(p.Warnings[2].Text, "tag nope names no version") {
		t.Errorf("warnings: %v", p.Warnings)
	}
	if !strings.HasPrefix(p.Warnings[0].String(), "a.yaml:1: r/x@sha256:") {
		t.Errorf("warning text %q", p.Warnings[0])
	}
	type want struct {
		d      digest.Digest
		action Action
		kind   string
	}
	wants := []want{{pinned.Digest, ActionKeep, ReasonReferenced}, {old.Digest, ActionPurge, ReasonExpired}, {recent.Digest, ActionKeep, ReasonRestorable}}
	if len(p.Deleted) != len(wants) {
		t.Fatalf("tombstones: %+v", p.Deleted)
	}
	for i, w := range wants {
		d := p.Deleted[i]
		if d.Digest != w.d || d.Action != w.action || d.Reasons[0].Kind != w.kind || d.Record == nil {
			t.Errorf("tombstone %d: %+v, want %+v", i, d, w)
		}
	}
	if w := "restorable until 2025-06-08T11:00:00Z"; p.Deleted[2].Why() != w {
		t.Errorf("%q, want %q", p.Deleted[2].Why(), w)
	}
	// Without Purge, tombstones are not planned; the window 0 purges all.
	if p, _ := NewPlan(in, Policy{}); len(p.Deleted) != 0 {
		t.Errorf("tombstones planned without Purge: %v", p.Deleted)
	}
	p, _ = NewPlan(in, Policy{Purge: true})
	for _, d := range p.Deleted {
		if (d.Action == ActionPurge) == (d.Digest == pinned.Digest) {
			t.Errorf("window 0: %s %s (%s)", d.Digest, d.Action, d.Why())
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	if _, err := NewPlan(Input{}, Policy{KeepTags: []string{"[a"}}); err == nil {
		t.Error("bad glob accepted")
	}
	if _, err := NewPlan(Input{}, Policy{KeepLast: -1}); err == nil {
		t.Error("negative keep-last accepted")
	}
}

func TestDurations(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
	}{{"7d", 7 * 24 * time.Hour}, {"1d12h", 36 * time.Hour}, {"0s", 0}, {"90m", 90 * time.Minute}, {"0d", 0}} {
		got, err := ParseDuration(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "d", "7x", "-1d", "1.5d", "7dd"} {
		if _, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) accepted", bad)
		}
	}
	// Past int64 nanoseconds (about 106751 days) is refused, never wrapped
	// to a negative --keep-within.
	for _, long := range []string{"106752d", "200000d", "106751d24h", "9223372036854775807d"} {
		if d, err := ParseDuration(long); err == nil || !strings.Contains(err.Error(), "too long") {
			t.Errorf("ParseDuration(%q) = %v, %v; want a too-long error", long, d, err)
		}
	}
	if d, err := ParseDuration("106751d"); err != nil || d != 106751*24*time.Hour {
		t.Errorf("ParseDuration(106751d) = %v, %v", d, err)
	}
	if FormatDuration(7*24*time.Hour) != "7d" || FormatDuration(90*time.Minute) != "1h30m0s" {
		t.Error("FormatDuration")
	}
}
