package main

import (
	"context"
	"fmt"
	"time"

	"github.com/bdnvol/bdnvol/internal/pathglob"
	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/peer"
	"github.com/bdnvol/bdnvol/pkg/pull"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// SelectFlags pick the files a pull writes or a verify checks: the globs of
// sync (internal/pathglob).
type SelectFlags struct {
	Include []string `help:"Only files and symlinks whose path matches this glob, with the directories that hold them (repeatable; * matches across /, a trailing / is a subtree)."`
	Exclude []string `help:"Leave out paths matching this glob (repeatable)."`
}

// match is the selection the flags ask for; nil when they select all.
func (s SelectFlags) match() (func(string) bool, error) {
	f, err := pathglob.New(s.Include, s.Exclude)
	if err != nil {
		return nil, usageError{fmt.Errorf("--include/--exclude: %w", err)}
	}
	if f.All() {
		return nil, nil
	}
	return f.Match, nil
}

// PullCmd materialises a version on disk.
type PullCmd struct {
	Ref  string `arg:"" help:"Source: HOST/REPO:TAG, HOST/REPO@DIGEST or oci:PATH[:TAG|@DIGEST]."`
	Dir  string `arg:"" type:"path" help:"Directory to write into (created if missing)."`
	JSON bool   `name:"json" help:"Print one JSON object instead of text."`
	Jobs int    `default:"8" help:"Concurrent chunk fetches."`

	SelectFlags `embed:""`
	RateFlags   `embed:""`

	VerifyFiles bool `name:"verify-files" help:"Also check every written file's SHA-256 before it is renamed into place (reads each file once more; chunk digests are always checked)."`

	Cache       bool `xor:"cache" help:"Also store fetched chunks in the shared chunk cache (for mounts and later pulls). By default a pull uses chunks already in the cache but adds none: DIR holds every byte anyway."`
	NoCache     bool `name:"no-cache" xor:"cache" help:"Neither use nor fill the shared chunk cache."`
	CacheSize   Size `name:"cache-size" default:"10GiB" help:"Bound of the shared chunk cache with --cache."`
	MirrorFlags `embed:""`

	RequireSignature []string `name:"require-signature" type:"path" placeholder:"KEY" help:"Refuse the version unless it carries a valid signature by this cosign public key (repeatable: any one of them)."`

	PullPeerFlags `embed:""`
}

// PullPeerFlags make a pull a node of a peer tier for its duration: the
// mounter's peer flags (bdnvol csi mounter), and how long it serves once
// done.
type PullPeerFlags struct {
	PeerListen    string        `name:"peer-listen" placeholder:"HOST:PORT" help:"Serve the chunk cache to the other pulls here while this pull runs, fetch from the registry only the chunks this node owns and ask their owners for the rest (the peer tier; off by default; fills the chunk cache under --cache-dir)."`
	PeerAdvertise string        `name:"peer-advertise" placeholder:"HOST:PORT" help:"This node's peer address as the others reach it (default --peer-listen)."`
	Peers         []string      `name:"peers" placeholder:"HOST:PORT,..." help:"The peer addresses of the nodes pulling at the same time (static membership)."`
	PeerTLSDir    string        `name:"peer-tls-dir" type:"path" placeholder:"DIR" help:"ca.crt, tls.crt and tls.key: mutual TLS between the nodes (certificates of one CA)."`
	PeerInsecure  bool          `name:"peer-insecure" help:"Allow plain HTTP between the nodes without --peer-tls-dir (tests; a node network you vouch for)."`
	PeerLinger    time.Duration `name:"peer-linger" default:"5s" help:"Once done, go on serving the other nodes until none asked for this long (at most 10 minutes)."`
}

// config is the peer tier the flags ask for; nil for none.
func (p PullPeerFlags) config() (*peer.Config, error) {
	if p.PeerListen == "" {
		if p.PeerAdvertise != "" || len(p.Peers) > 0 || p.PeerTLSDir != "" || p.PeerInsecure {
			return nil, usageError{fmt.Errorf("--peers, --peer-advertise, --peer-tls-dir and --peer-insecure need --peer-listen")}
		}
		return nil, nil
	}
	if p.PeerTLSDir == "" && !p.PeerInsecure {
		return nil, usageError{fmt.Errorf("--peer-listen needs --peer-tls-dir, or --peer-insecure for plain HTTP")}
	}
	return &peer.Config{Listen: p.PeerListen, Advertise: p.PeerAdvertise, Peers: p.Peers, TLSDir: p.PeerTLSDir, Insecure: p.PeerInsecure}, nil
}

// Run pulls the version.
func (c *PullCmd) Run(ctx context.Context, g *Globals) error {
	ref, err := parseVersionRef(c.Ref)
	if err != nil {
		return err
	}
	if err := c.MirrorFlags.check(); err != nil {
		return err
	}
	policy, err := signature.LoadPolicy(c.RequireSignature...)
	if err != nil {
		return usageError{err}
	}
	sel, err := c.SelectFlags.match()
	if err != nil {
		return err
	}
	peers, err := c.PullPeerFlags.config()
	if err != nil {
		return err
	}
	if peers != nil && c.NoCache {
		return usageError{fmt.Errorf("--peer-listen serves the chunk cache: it cannot go with --no-cache")}
	}
	c.RateFlags.apply(g)
	counters := &progress.Counters{}
	out, err := pull.Pull(ctx, ref, c.Dir, pull.Options{
		OCI: g.options(), Mirrors: c.MirrorFlags.config(g), Policy: policy,
		CacheDir: g.cacheDir(), Cache: pull.CacheModeOf(c.Cache, c.NoCache), CacheSize: int64(c.CacheSize),
		Jobs: c.Jobs, VerifyFiles: c.VerifyFiles, Counters: counters, Logf: g.logf, Select: sel,
		Peers: peers, PeerLinger: c.PeerLinger,
		Progress: func() func() { return startProgress(g.stderr, "pull", counters) },
	})
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(out)
	}
	fmt.Fprintf(g.stderr, "pulled %d files, %s; fetched %d chunks, %s; copied %d chunks, %s, from files already there in %.1fs\n",
		out.Files, units.Bytes(out.Bytes), out.ChunksFetched, units.Bytes(out.BytesFetched), out.ChunksCopied, units.Bytes(out.BytesCopied), out.Seconds)
	if peers != nil {
		fmt.Fprintf(g.stderr, "peers sent %s, this node served them %s\n", units.Bytes(out.PeerBytes), units.Bytes(out.ServedToPeers))
	}
	fmt.Fprintln(g.stdout, out.Reference)
	return nil
}
