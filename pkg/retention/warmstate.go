package retention

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/opencontainers/go-digest"
	"gopkg.in/yaml.v3"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/warmstate"
)

// Keys of a warm-state volume's attributes (the CSI driver's
// volumeAttributes, docs/warm-state.md).
const (
	attrRef          = "ref"
	attrWarmstateKey = "warmstateKey"
)

// maxWarmDocs bounds the YAML documents one text is read for warm-state
// volumes.
const maxWarmDocs = 10000

// scanWarmKeys returns the warm-state volumes in the YAML or JSON text b
// whose version is in the repository repo: each mapping that holds a
// string warmstateKey beside a ref naming repo (a CSI volume's
// volumeAttributes), as a Reference with WarmstateKey set (canonical when
// it parses, as written when not). Text that is not YAML has none.
func scanWarmKeys(repo oci.Ref, name string, b []byte) []Reference {
	want := repo.Repo()
	var out []Reference
	var walk func(n *yaml.Node, depth int)
	walk = func(n *yaml.Node, depth int) {
		if n == nil || depth > 100 {
			return
		}
		if n.Kind == yaml.MappingNode {
			var ref, key *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if v.Kind != yaml.ScalarNode {
					continue
				}
				switch k.Value {
				case attrRef:
					ref = v
				case attrWarmstateKey:
					key = v
				}
			}
			if ref != nil && key != nil {
				if r, err := oci.ParseRef(ref.Value); err == nil && r.Repo() == want {
					k := key.Value
					if pk, err := warmstate.ParseKey(k); err == nil {
						k = pk.String()
					}
					out = append(out, Reference{Source: fmt.Sprintf("%s:%d", name, key.Line), Ref: ref.Value,
						Digest: r.Digest, Tag: r.Tag, WarmstateKey: k})
				}
			}
		}
		for _, c := range n.Content {
			walk(c, depth+1)
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for range maxWarmDocs {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if !errors.Is(err, io.EOF) {
				return out // not YAML past here
			}
			break
		}
		walk(&doc, 0)
	}
	return out
}

// CompanionDrop is a warm-state companion of a kept version that no
// warm-state volume among the references uses, which GC with
// DropUnusedCompanions deletes.
type CompanionDrop struct {
	Version   digest.Digest `json:"version"`
	Companion digest.Digest `json:"companion"`
	Key       string        `json:"key"`
	Done      bool          `json:"done,omitempty"`  // deleted (with Apply)
	Error     string        `json:"error,omitempty"` // why it could not be
}

// usesKey reports whether a warm-state volume of the key want uses a
// companion of key have: every field want names, have has with the same
// value. The node plugin completes a volume's key with the node's own
// fields (the GPU, the driver), so a volume that leaves them out uses the
// companions of every node's.
func usesKey(want, have warmstate.Key) bool {
	for name, v := range want {
		if have[name] != v {
			return false
		}
	}
	return true
}

// unusedCompanions returns the companions of the versions plan keeps that
// no warm-state volume of refs uses: one of the version (by digest, or by
// a tag it has now) whose key the companion's completes. A companion that
// is invalid is left alone (no reader ever matches it; ls shows why).
func unusedCompanions(ctx context.Context, t oci.Target, plan *Plan, refs []Reference) ([]CompanionDrop, error) {
	var out []CompanionDrop
	for _, v := range plan.Versions {
		if v.Action != ActionKeep {
			continue
		}
		var keys []warmstate.Key
		for _, r := range refs {
			if r.WarmstateKey == "" || !(r.Digest == v.Digest || r.Digest == "" && slices.Contains(v.Tags, r.Tag)) {
				continue
			}
			if k, err := warmstate.ParseKey(r.WarmstateKey); err == nil {
				keys = append(keys, k)
			}
		}
		root, err := t.Resolve(ctx, v.Digest.String())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.Digest, err)
		}
		cs, err := warmstate.List(ctx, t, root)
		if err != nil {
			return nil, fmt.Errorf("%s: warm-state companions: %w", v.Digest, err)
		}
		for _, c := range cs {
			if c.Err != nil || slices.ContainsFunc(keys, func(k warmstate.Key) bool { return usesKey(k, c.Key) }) {
				continue
			}
			out = append(out, CompanionDrop{Version: v.Digest, Companion: c.Desc.Digest, Key: c.Key.String()})
		}
	}
	return out, nil
}

// dropCompanions deletes the companions of drops (each index and its
// signatures), recording in each whether it was; the first error is
// returned after trying every one.
func dropCompanions(ctx context.Context, t oci.Target, drops []CompanionDrop) error {
	var first error
	for i := range drops {
		d := &drops[i]
		desc, err := t.Resolve(ctx, d.Companion.String())
		if err == nil {
			err = warmstate.Delete(ctx, t, desc)
		}
		if errors.Is(err, oci.ErrNotFound) {
			err = nil // deleted since the plan
		}
		if err != nil {
			d.Error = err.Error()
			if first == nil {
				first = fmt.Errorf("companion %s of %s: %w", d.Companion, d.Version, err)
			}
			continue
		}
		d.Done = true
	}
	return first
}
