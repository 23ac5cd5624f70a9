package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// ProfileCmd records, shares and shows startup profiles.
type ProfileCmd struct {
	Record ProfileRecordCmd `cmd:"" help:"Mount a version, run a command on it and record what it reads at start, in order."`
	Push   ProfilePushCmd   `cmd:"" help:"Attach a profile to its version as an OCI referrer."`
	Pull   ProfilePullCmd   `cmd:"" help:"Fetch the profile attached to a version into the node's store (or a file)."`
	Show   ProfileShowCmd   `cmd:"" help:"Print a profile: its version and chunks (a FILE, or the one the node or registry holds for REF)."`
}

// ProfileRecordCmd records a startup profile.
type ProfileRecordCmd struct {
	Ref       string        `arg:"" help:"Version: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Command   []string      `arg:"" passthrough:"" help:"The command to run after --; the mountpoint is in $BDNVOL_MOUNT."`
	Output    string        `short:"o" type:"path" placeholder:"FILE" help:"Write the profile here (default: the node's profile store, next to the chunk cache)."`
	Push      bool          `help:"Also attach the profile to the version as a referrer."`
	Quiet     time.Duration `default:"10s" help:"The window closes when no new chunk was read for this long (the command is then stopped)."`
	MaxTime   time.Duration `name:"max-time" default:"10m" help:"The window closes this long after the mount."`
	MaxChunks int           `name:"max-chunks" default:"0" help:"The window closes after this many chunks (0: the format's bound)."`
	CacheSize Size          `name:"cache-size" default:"10GiB" help:"Bound of the shared chunk cache."`
	Jobs      int           `default:"8" help:"Concurrent background chunk fetches."`
}

// Run mounts, runs the command and writes the profile.
func (c *ProfileRecordCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return err
	}
	if len(c.Command) > 0 && c.Command[0] == "--" {
		c.Command = c.Command[1:]
	}
	if len(c.Command) == 0 {
		return usageError{errors.New("no command: bdnvol profile record REF -- COMMAND [ARGS]")}
	}
	cache, err := chunkcache.Open(filepath.Join(g.cacheDir(), "chunks"), int64(c.CacheSize))
	if err != nil {
		return err
	}
	r, err := mounts.Record(ctx, ref, mounts.RecordOptions{
		Open:   mounts.OpenOptions{OCI: g.options(), Cache: cache, Jobs: c.Jobs},
		Serve:  mounts.ServeOptions{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Logf: g.logf},
		Window: profile.Window{Quiet: c.Quiet, MaxTime: c.MaxTime, MaxChunks: c.MaxChunks},
		Run:    c.runCommand(g),
	})
	if err != nil {
		return fmt.Errorf("%s: %w", c.Ref, err)
	}
	if r.Stopped {
		g.logf("reads paused for %s: the command was stopped", c.Quiet)
	}
	where, err := writeProfile(cache, r.Profile, c.Output)
	if err != nil {
		return err
	}
	g.logf("recorded %d chunks of %s in %s", len(r.Profile.Chunks), r.Pinned, where)
	if c.Push {
		if err := pushProfile(ctx, g, r.Pinned, r.Profile); err != nil {
			return err
		}
	}
	fmt.Fprintln(g.stdout, where)
	return nil
}

// runCommand runs the command with the mountpoint in $BDNVOL_MOUNT, its
// output on stderr; a stop sends SIGTERM, then SIGKILL after 10s.
func (c *ProfileRecordCmd) runCommand(g *Globals) func(ctx context.Context, mp string) error {
	return func(ctx context.Context, mp string) error {
		cmd := exec.CommandContext(ctx, c.Command[0], c.Command[1:]...)
		cmd.Env = append(os.Environ(), "BDNVOL_MOUNT="+mp)
		cmd.Stdout, cmd.Stderr = g.stderr, g.stderr
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 10 * time.Second
		return cmd.Run()
	}
}

func writeProfile(cache *chunkcache.Cache, p *profile.Profile, file string) (string, error) {
	if file == "" {
		s := profile.StoreIn(cache.Dir())
		return s.Path(p.Version), s.Save(p)
	}
	return file, atomicfile.WriteFile(file, p.Encode(), 0o644)
}

func pushProfile(ctx context.Context, g *Globals, ref string, p *profile.Profile) error {
	r, t, root, err := openVersion(ctx, g, ref)
	if err != nil {
		return err
	}
	md, err := profile.Push(ctx, t, root.Desc, p)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Pinned(root.Desc.Digest), err)
	}
	g.logf("profile of %s attached as referrer %s", r.Pinned(root.Desc.Digest), md.Digest)
	return nil
}

// ProfilePushCmd attaches a profile file to its version.
type ProfilePushCmd struct {
	Ref  string `arg:"" help:"The version the profile belongs to."`
	File string `arg:"" type:"existingfile" help:"The profile (from bdnvol profile record)."`
}

// Run pushes the profile.
func (c *ProfilePushCmd) Run(ctx context.Context, g *Globals) error {
	p, err := profile.ReadFile(c.File)
	if err != nil {
		return usageError{err}
	}
	return pushProfile(ctx, g, c.Ref, p)
}

// ProfilePullCmd fetches the profile attached to a version.
type ProfilePullCmd struct {
	Ref    string `arg:"" help:"The version."`
	Output string `short:"o" type:"path" placeholder:"FILE" help:"Write it here (default: the node's profile store)."`
}

// Run fetches the profile.
func (c *ProfilePullCmd) Run(ctx context.Context, g *Globals) error {
	r, t, root, err := openVersion(ctx, g, c.Ref)
	if err != nil {
		return err
	}
	p, err := profile.Fetch(ctx, t, root.Desc)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Pinned(root.Desc.Digest), err)
	}
	cache, err := chunkcache.Open(filepath.Join(g.cacheDir(), "chunks"), 0)
	if err != nil {
		return err
	}
	where, err := writeProfile(cache, p, c.Output)
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, where)
	return nil
}

// ProfileShowCmd prints a profile.
type ProfileShowCmd struct {
	Target string `arg:"" name:"ref-or-file" help:"A profile file, or a version (the node's stored profile, else its referrer)."`
	JSON   bool   `name:"json" help:"Print the document itself."`
}

// Run prints the profile.
func (c *ProfileShowCmd) Run(ctx context.Context, g *Globals) error {
	p, from, err := c.find(ctx, g)
	if err != nil {
		return err
	}
	if c.JSON {
		_, err := g.stdout.Write(p.Encode())
		return err
	}
	fmt.Fprintf(g.stdout, "profile of %s (%s): %d chunks in first-read order\n", p.Version, from, len(p.Chunks))
	for _, d := range p.Chunks {
		fmt.Fprintln(g.stdout, d)
	}
	return nil
}

func (c *ProfileShowCmd) find(ctx context.Context, g *Globals) (*profile.Profile, string, error) {
	if _, err := os.Stat(c.Target); err == nil {
		p, err := profile.ReadFile(c.Target)
		return p, c.Target, err
	}
	r, t, root, err := openVersion(ctx, g, c.Target)
	if err != nil {
		return nil, "", err
	}
	opt := profile.Options{Mode: profile.ModeAuto, Store: profile.StoreIn(filepath.Join(g.cacheDir(), "chunks"))}
	p, from, err := profile.Find(ctx, t, root.Desc, opt)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", r.Pinned(root.Desc.Digest), err)
	}
	return p, from, nil
}
