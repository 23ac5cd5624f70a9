package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/pull"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/statcache"
	"github.com/bdnvol/bdnvol/pkg/warmstate"
)

// WarmstateCmd publishes, lists and fetches warm-state companions.
type WarmstateCmd struct {
	Push WarmstatePushCmd `cmd:"" help:"Seal a cache directory and attach it to a version as the companion of a key (once per key)."`
	Ls   WarmstateLsCmd   `cmd:"" help:"List a version's warm-state companions and their keys."`
	Pull WarmstatePullCmd `cmd:"" help:"Materialise the companion whose key equals --key exactly (exit 1 when there is none)."`
	Rm   WarmstateRmCmd   `cmd:"" help:"Delete the companion of a key (and its signatures); a new one is then a new artifact."`
	// Export and Import speak Model Cache Vault's compat image.
	Export WarmstateExportCmd `cmd:"" help:"Write the companion of a key as a Model Cache Vault compat image (one gzip layer under io.<type>.cache/, cache labels), for GKM and KServe."`
	Import WarmstateImportCmd `cmd:"" help:"Publish a Model Cache Vault compat image's cache as the companion of a key (the image's bdnvol key label, or --key)."`
}

// KeyFlags name a warm-state key.
type KeyFlags struct {
	Key []string `required:"" placeholder:"NAME=VALUE" help:"A key field (repeatable, or comma-separated): engine, engine-image, gpu, cc, driver, tp, pp, dp, ep, rank, dtype, quant, compile-hash, or any other NAME."`
}

func (k KeyFlags) key() (warmstate.Key, error) {
	key, err := warmstate.ParseFields(k.Key)
	if err != nil {
		return nil, usageError{fmt.Errorf("--key: %w", err)}
	}
	return key, nil
}

// companionJSON is a companion in --json output.
type companionJSON struct {
	Digest string `json:"digest"`
	Tree   string `json:"tree,omitempty"`
	Key    string `json:"key,omitempty"`
	Error  string `json:"error,omitempty"`
}

func companionOut(c warmstate.Companion) companionJSON {
	o := companionJSON{Digest: c.Desc.Digest.String()}
	if c.Err != nil {
		o.Error = c.Err.Error()
		return o
	}
	o.Tree, o.Key = c.Tree.Digest.String(), c.Key.String()
	return o
}

// WarmstatePushCmd publishes a companion.
type WarmstatePushCmd struct {
	Ref      string `arg:"" help:"The version the cache was built for: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir      string `arg:"" type:"existingdir" help:"The cache directory, sealed as it is (paths relative to it)."`
	KeyFlags `embed:""`
	SignKey  string        `name:"sign-key" type:"path" placeholder:"KEY" help:"Sign the companion's digest with this cosign private key."`
	Holder   string        `help:"Who publishes, recorded in the lease (default: the host name)."`
	LeaseTTL time.Duration `name:"lease-ttl" default:"30m" help:"How long the publishing lease holds another publisher off."`
	Jobs     int           `default:"8" help:"Concurrent uploads."`
	JSON     bool          `name:"json" help:"Print one JSON object instead of text."`
}

// Run publishes the companion.
func (c *WarmstatePushCmd) Run(ctx context.Context, g *Globals) error {
	key, err := c.KeyFlags.key()
	if err != nil {
		return err
	}
	var s signature.Signer
	if c.SignKey != "" {
		if s, err = signature.LoadPrivateKey(c.SignKey, signature.Password(g.stderr)); err != nil {
			return usageError{err}
		}
	}
	holder := c.Holder
	if holder == "" {
		holder, _ = os.Hostname()
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	counters := &progress.Counters{}
	stop := startProgress(g.stderr, "warmstate push", counters)
	p, err := warmstate.Publish(ctx, t, root.Desc, key, push.DirSource(c.Dir), warmstate.PublishOptions{
		Push: push.Options{
			Jobs: c.Jobs, Counters: counters,
			Cache: statcache.Open(g.cacheDir(), c.Dir, layout.DefaultParams),
		},
		Signer: s, Repo: signature.RepoName(ref), Holder: holder, LeaseTTL: c.LeaseTTL,
	})
	stop()
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	if c.JSON {
		out := map[string]any{"companion": companionOut(p.Companion), "existed": p.Existed, "lost": p.Lost}
		if p.Push != nil {
			out["bytes"], out["bytes_uploaded"], out["files"] = p.Push.Bytes, p.Push.BytesUploaded, p.Push.Files
		}
		return g.printJSON(out)
	}
	switch {
	case p.Existed:
		g.logf("a companion of this key was there already: nothing pushed")
	case p.Lost:
		g.logf("another publisher's companion of this key won; %s uploaded for nothing", units.Bytes(p.Push.BytesUploaded))
	default:
		g.logf("sealed %d files, %s; uploaded %s", p.Push.Files, units.Bytes(p.Push.Bytes), units.Bytes(p.Push.BytesUploaded))
	}
	fmt.Fprintln(g.stdout, ref.Pinned(p.Companion.Desc.Digest))
	return nil
}

// WarmstateLsCmd lists companions.
type WarmstateLsCmd struct {
	Ref  string `arg:"" help:"The version."`
	JSON bool   `name:"json" help:"Print a JSON array instead of text."`
}

// Run lists the companions.
func (c *WarmstateLsCmd) Run(ctx context.Context, g *Globals) error {
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	cs, err := warmstate.List(ctx, t, root.Desc)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	out := make([]companionJSON, 0, len(cs))
	for _, x := range cs {
		out = append(out, companionOut(x))
	}
	if c.JSON {
		return g.printJSON(out)
	}
	for _, o := range out {
		if o.Error != "" {
			fmt.Fprintf(g.stdout, "%s\tinvalid: %s\n", o.Digest, o.Error)
			continue
		}
		fmt.Fprintf(g.stdout, "%s\t%s\n", o.Digest, o.Key)
	}
	return nil
}

// WarmstatePullCmd materialises a companion.
type WarmstatePullCmd struct {
	Ref              string `arg:"" help:"The version."`
	Dir              string `arg:"" type:"path" help:"Directory to write the cache into (created if missing)."`
	KeyFlags         `embed:""`
	Jobs             int      `default:"8" help:"Concurrent chunk fetches."`
	RequireSignature []string `name:"require-signature" type:"path" placeholder:"KEY" help:"Only a companion signed by this cosign public key counts (repeatable: any one of them)."`
	JSON             bool     `name:"json" help:"Print one JSON object instead of text."`
}

// Run finds and pulls the companion.
func (c *WarmstatePullCmd) Run(ctx context.Context, g *Globals) error {
	key, err := c.KeyFlags.key()
	if err != nil {
		return err
	}
	policy, err := signature.LoadPolicy(c.RequireSignature...)
	if err != nil {
		return usageError{err}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	comp, err := warmstate.Find(ctx, t, root.Desc, key, policy)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	// The tree's digest is in the companion checked above: it is pulled
	// by that digest, with no policy of its own.
	tree := ref
	tree.Tag, tree.Digest = "", comp.Tree.Digest
	counters := &progress.Counters{}
	out, err := pull.Pull(ctx, tree, c.Dir, pull.Options{
		OCI: g.options(), CacheDir: g.cacheDir(), Cache: pull.CacheModeOf(false, false),
		Jobs: c.Jobs, Counters: counters, Logf: g.logf,
		Progress: func() func() { return startProgress(g.stderr, "warmstate pull", counters) },
	})
	if err != nil {
		return fmt.Errorf("companion %s: %w", comp.Desc.Digest, err)
	}
	if c.JSON {
		return g.printJSON(map[string]any{"companion": companionOut(*comp), "files": out.Files, "bytes": out.Bytes, "bytes_fetched": out.BytesFetched})
	}
	g.logf("pulled %d files, %s (fetched %s)", out.Files, units.Bytes(out.Bytes), units.Bytes(out.BytesFetched))
	fmt.Fprintln(g.stdout, ref.Pinned(comp.Desc.Digest))
	return nil
}

// WarmstateRmCmd deletes a companion.
type WarmstateRmCmd struct {
	Ref      string `arg:"" help:"The version."`
	KeyFlags `embed:""`
}

// Run deletes the companion of the key.
func (c *WarmstateRmCmd) Run(ctx context.Context, g *Globals) error {
	key, err := c.KeyFlags.key()
	if err != nil {
		return err
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	cs, err := warmstate.List(ctx, t, root.Desc)
	if err != nil {
		return err
	}
	ms := warmstate.Matches(cs, key)
	if len(ms) == 0 {
		return fmt.Errorf("%s: %w %s", ref.Pinned(root.Desc.Digest), warmstate.ErrNotFound, key)
	}
	var errs []error
	for _, m := range ms {
		if err := warmstate.Delete(ctx, t, m.Desc); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintln(g.stdout, ref.Pinned(m.Desc.Digest))
	}
	return errors.Join(errs...)
}

// WarmstateExportCmd writes a companion as a compat image.
type WarmstateExportCmd struct {
	Ref              string `arg:"" help:"The version."`
	Image            string `arg:"" help:"Where to write the image: HOST/REPO:TAG or oci:PATH:TAG."`
	KeyFlags         `embed:""`
	Type             string   `default:"vllm" enum:"vllm,triton" help:"Cache type: vllm (io.vllm.cache/) or triton (io.triton.cache/)."`
	RequireSignature []string `name:"require-signature" type:"path" placeholder:"KEY" help:"Only a companion signed by this cosign public key counts."`
}

// Run exports the companion.
func (c *WarmstateExportCmd) Run(ctx context.Context, g *Globals) error {
	key, err := c.KeyFlags.key()
	if err != nil {
		return err
	}
	policy, err := signature.LoadPolicy(c.RequireSignature...)
	if err != nil {
		return usageError{err}
	}
	iref, err := oci.ParseRef(c.Image)
	if err != nil || iref.Tag == "" || iref.Digest != "" {
		return usageError{fmt.Errorf("image %q: name it HOST/REPO:TAG or oci:PATH:TAG", c.Image)}
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	comp, err := warmstate.Find(ctx, t, root.Desc, key, policy)
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	dir, err := os.MkdirTemp("", "bdnvol-warmstate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tree := ref
	tree.Tag, tree.Digest = "", comp.Tree.Digest
	if _, err := pull.Pull(ctx, tree, dir, pull.Options{OCI: g.options(), CacheDir: g.cacheDir(), Cache: pull.CacheModeOf(false, false), Logf: g.logf}); err != nil {
		return fmt.Errorf("companion %s: %w", comp.Desc.Digest, err)
	}
	opt := g.options()
	opt.CreateLayout = true
	it, err := oci.Open(ctx, iref, opt)
	if err != nil {
		return err
	}
	d, err := warmstate.ExportMCV(ctx, it, dir, c.Type, key)
	if err != nil {
		return err
	}
	if err := it.Tag(ctx, d, iref.Tag); err != nil {
		return fmt.Errorf("tag %s: %w", iref, err)
	}
	fmt.Fprintln(g.stdout, iref.Pinned(d.Digest))
	return nil
}

// WarmstateImportCmd publishes a compat image as a companion.
type WarmstateImportCmd struct {
	Image    string   `arg:"" help:"The compat image: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Ref      string   `arg:"" help:"The version the cache was built for."`
	Key      []string `placeholder:"NAME=VALUE" help:"The key (as warmstate push takes it); without it, the image's dev.bdnvol.warmstate.key label."`
	MaxBytes Size     `name:"max-bytes" default:"64GiB" help:"Refuse an image whose cache holds more bytes than this."`
	SignKey  string   `name:"sign-key" type:"path" placeholder:"KEY" help:"Sign the companion's digest with this cosign private key."`
	JSON     bool     `name:"json" help:"Print one JSON object instead of text."`
}

// Run imports the image.
func (c *WarmstateImportCmd) Run(ctx context.Context, g *Globals) error {
	var key warmstate.Key
	if len(c.Key) > 0 {
		k, err := (KeyFlags{Key: c.Key}).key()
		if err != nil {
			return err
		}
		key = k
	}
	var s signature.Signer
	if c.SignKey != "" {
		var err error
		if s, err = signature.LoadPrivateKey(c.SignKey, signature.Password(g.stderr)); err != nil {
			return usageError{err}
		}
	}
	iref, err := oci.ParseRef(c.Image)
	if err != nil {
		return usageError{err}
	}
	it, err := oci.Open(ctx, iref, g.options())
	if err != nil {
		return err
	}
	idesc, _, err := oci.FetchManifest(ctx, it, iref, oci.MaxManifestBytes)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "bdnvol-mcv-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	img, err := warmstate.ImportMCV(ctx, it, idesc, tmp+"/cache", int64(c.MaxBytes))
	if err != nil {
		return fmt.Errorf("%s: %w", iref.Pinned(idesc.Digest), err)
	}
	if key == nil {
		if img.Key == nil {
			return usageError{fmt.Errorf("%s has no %s label: give --key", iref.Pinned(idesc.Digest), warmstate.LabelKey)}
		}
		key = img.Key
	}
	ref, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	holder, _ := os.Hostname()
	p, err := warmstate.Publish(ctx, t, root.Desc, key, push.DirSource(tmp+"/cache"), warmstate.PublishOptions{
		Signer: s, Repo: signature.RepoName(ref), Holder: holder,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", ref.Pinned(root.Desc.Digest), err)
	}
	if c.JSON {
		return g.printJSON(map[string]any{"companion": companionOut(p.Companion), "existed": p.Existed, "type": img.Type, "files": img.Files, "bytes": img.Bytes})
	}
	g.logf("imported %d files, %s of %s cache", img.Files, units.Bytes(img.Bytes), img.Type)
	fmt.Fprintln(g.stdout, ref.Pinned(p.Companion.Desc.Digest))
	return nil
}
