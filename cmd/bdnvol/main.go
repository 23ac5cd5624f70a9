// Command bdnvol stores sealed, versioned volumes of model weights and data
// in OCI registries and local OCI layouts.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/internal/signals"
	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/units"
	"github.com/bdnvol/bdnvol/pkg/csi"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// version is set at build time.
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Globals are the flags every command takes.
type Globals struct {
	PlainHTTP          bool   `help:"Use plain HTTP for non-loopback registries." name:"plain-http"`
	InsecureSkipVerify bool   `help:"Accept any TLS certificate (unsafe)." name:"insecure-skip-verify"`
	CAFile             string `help:"PEM file of extra CA certificates." name:"ca-file" type:"path"`
	CacheDir           string `help:"Cache directory (default $XDG_CACHE_HOME/bdnvol)." name:"cache-dir" type:"path"`
	TLS                bool   `help:"Use TLS even for loopback registries." name:"tls"`
	UploadPartSize     Size   `help:"Upload blobs in PATCH parts of this size (0: one request per blob, parts after a 413)." name:"upload-part-size"`

	stdout, stderr io.Writer
	limiter        *ratelimit.Limiter // --max-rate of the command, for every client options() builds
}

// RateFlags bound the bytes per second of a whole command.
type RateFlags struct {
	MaxRate Size `name:"max-rate" default:"0" help:"Bytes per second the command moves at most over the network, all transfers together (e.g. 20MiB; 0: no bound)."`
}

// apply makes every client g.options() builds share the bound.
func (r RateFlags) apply(g *Globals) { g.limiter = ratelimit.New(int64(r.MaxRate)) }

// CLI is the command line of bdnvol.
type CLI struct {
	Globals

	Push    PushCmd    `cmd:"" help:"Seal a directory as a new version and push it."`
	Pull    PullCmd    `cmd:"" help:"Materialise a version in a directory."`
	Copy    CopyCmd    `cmd:"" help:"Copy versions between registries and OCI layouts, sending only the blobs the destination lacks."`
	Login   LoginCmd   `cmd:"" help:"Save credentials for a registry."`
	Logout  LogoutCmd  `cmd:"" help:"Remove saved credentials for a registry."`
	Version VersionCmd `cmd:"" help:"Print the version."`
	Mount   MountCmd   `cmd:"" help:"Mount a version read-only with FUSE; chunks are fetched as files are read."`
	Umount  UmountCmd  `cmd:"" help:"Unmount a bdnvol mount."`
	Mounts  MountsCmd  `cmd:"" help:"List the bdnvol mounts on this machine with the digest each serves."`

	Versions VersionsCmd `cmd:"" help:"List the sealed versions of a volume, newest first."`
	Resolve  ResolveCmd  `cmd:"" help:"Print the digest-pinned reference of a tag or digest."`
	Inspect  InspectCmd  `cmd:"" help:"Describe one version: files, chunks, tags."`
	Tag      TagCmd      `cmd:"" help:"Point tags at an existing version (rollback)."`
	History  HistoryCmd  `cmd:"" help:"List where a tag pointed and when."`
	Diff     DiffCmd     `cmd:"" help:"Compare two versions by file and by chunk."`
	Pin      PinCmd      `cmd:"" help:"Pin tag references in YAML or JSON files to digests, in place."`
	Lint     LintCmd     `cmd:"" help:"Report volume references that are unpinned, missing or moved."`
	GC       GCCmd       `cmd:"" name:"gc" help:"Delete old versions that no tag, deploy reference or running mount keeps (prints a plan unless --apply)."`
	Rm       RmCmd       `cmd:"" help:"Delete one version, restorably; refuses while a reference names it."`
	Restore  RestoreCmd  `cmd:"" help:"Bring a deleted version back (without its former tags)."`
	Sign     SignCmd     `cmd:"" help:"Sign a version's digest with a cosign key (stored where cosign looks)."`
	Verify   VerifyCmd   `cmd:"" help:"Check a version's signature (--key) and/or a directory against the version: sizes, modes, SHA-256, symlinks, extra and missing entries (exit 1 on any difference)."`

	Sync SyncCmd `cmd:"" help:"Seal a Hugging Face, S3, GCS or HTTP source as a new version, as a job."`
	Jobs JobsCmd `cmd:"" help:"List, wait for, cancel, resume and read the logs of sync jobs."`

	Cache     CacheCmd     `cmd:"" help:"Warm, list and drop versions in the node's chunk cache."`
	Warmstate WarmstateCmd `cmd:"" help:"Publish, list and fetch warm state: an engine's compile and kernel caches attached to the version they were built for, by exact key."`
	Profile   ProfileCmd   `cmd:"" help:"Record, share and show startup profiles: what a workload reads of a version at start, in order, fetched first by later mounts."`
	CSI       CSICmd       `cmd:"" name:"csi" help:"Kubernetes CSI node plugin: the mounter and the node services."`

	ExportImage     ExportImageCmd     `cmd:"" name:"export-image" help:"Build an eStargz OCI image of a version's tree, attached to the version as a referrer."`
	ExportModelPack ExportModelPackCmd `cmd:"" name:"export-modelpack" help:"Write a ModelPack view of a version (one .raw layer per file), attached to the version as a referrer."`
	IndexModelPack  IndexModelPackCmd  `cmd:"" name:"index-modelpack" help:"Publish a ModelPack model's derived index beside it, signed, so that machines trusting the key open it lazily (without reading every layer)."`
}

func (g *Globals) options() oci.Options {
	return oci.Options{
		PlainHTTP:          g.PlainHTTP,
		ForceTLS:           g.TLS,
		InsecureSkipVerify: g.InsecureSkipVerify,
		CAFile:             g.CAFile,
		PartSize:           int64(g.UploadPartSize),
		UserAgent:          "bdnvol/" + version,
		Limiter:            g.limiter,
	}
}

func (g *Globals) cacheDir() string {
	if g.CacheDir != "" {
		return g.CacheDir
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "bdnvol")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "bdnvol")
	}
	return filepath.Join(os.TempDir(), "bdnvol-cache")
}

// VersionCmd prints the version.
type VersionCmd struct{}

// Run prints the version.
func (c *VersionCmd) Run(g *Globals) error {
	fmt.Fprintln(g.stdout, "bdnvol", version)
	return nil
}

// usageError marks an error that should exit 2.
type usageError struct{ error }

// defaultMemoryLimit is the soft memory limit of the Go runtime, when
// GOMEMLIMIT is unset, for the commands whose live data grows with the
// file count (memoryLimited): their heap (a diff of two million-file
// versions: two indexes; a pull of a million files: the index and 45
// bytes a file; a push of a million files: its compact walk, the files'
// digests and extents, about 185 MB) is collected before it doubles. It
// is soft: a command whose live data is larger still runs, with more GC. A
// pull or push of large files holds far less than the limit, which then
// never binds.
const defaultMemoryLimit = 192 << 20

// memoryLimited names the commands defaultMemoryLimit applies to.
var memoryLimited = map[string]bool{"push": true, "pull": true, "mount": true, "versions": true, "inspect": true, "diff": true, "history": true, "verify": true}

// commandName returns the first argument that is not a flag: the command,
// unless a global flag with a value comes first (then no limit is set).
func commandName(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

// limitMemory sets defaultMemoryLimit when GOMEMLIMIT is unset and args
// run one of the memoryLimited commands.
func limitMemory(args []string) {
	if os.Getenv("GOMEMLIMIT") == "" && memoryLimited[commandName(args)] {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
}

func main() {
	limitMemory(os.Args[1:])
	if p := os.Getenv("BDNVOL_CPUPROFILE"); p != "" {
		if mounts.IsDaemon() {
			p += ".daemon" // not over the starting process's profile
		}
		if f, err := os.Create(p); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				code := run(os.Args[1:], os.Stdout, os.Stderr)
				pprof.StopCPUProfile()
				f.Close()
				os.Exit(code)
			}
		}
	}
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	// BDNVOL_MEMPROFILE names a file for the allocation profile of the
	// command, written as it ends (go tool pprof -sample_index=alloc_space).
	if p := os.Getenv("BDNVOL_MEMPROFILE"); p != "" {
		if f, err := os.Create(p); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	os.Exit(code)
}

// maxRepeatedFlag bounds how often one flag may be given: the flag parser
// spends time and memory quadratic in the repeats of a flag (5,000
// --exclude cost 642 MiB). A flag of a list also takes comma-separated
// values (--exclude 'a/*,b/*').
const maxRepeatedFlag = 1000

// repeatedFlag returns the first long flag args give more than
// maxRepeatedFlag times (before a "--"), and how often.
func repeatedFlag(args []string) (string, int) {
	counts := map[string]int{}
	var names []string
	for _, a := range args {
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "--") {
			name, _, _ := strings.Cut(a, "=")
			names = append(names, name)
			counts[name]++
		}
	}
	for _, name := range names {
		if counts[name] > maxRepeatedFlag {
			return name, counts[name]
		}
	}
	return "", 0
}

func run(args []string, stdout, stderr io.Writer) int {
	if name, n := repeatedFlag(args); name != "" {
		fmt.Fprintf(stderr, "bdnvol: %s given %d times: at most %d (a list flag also takes comma-separated values)\n", termsafe.Short(name), n, maxRepeatedFlag)
		return exitUsage
	}
	var cli CLI
	cli.stdout, cli.stderr = stdout, stderr
	exit := -1
	parser, err := kong.New(&cli,
		kong.Name("bdnvol"),
		kong.Description("Sealed, versioned volumes of model weights and data in OCI registries."),
		kong.UsageOnError(),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { exit = code }),
		kong.Bind(&cli.Globals),
		kong.Vars{"fd_holder_socket": csi.DefaultFDHolderSocket},
	)
	if err != nil {
		fmt.Fprintln(stderr, "bdnvol:", err)
		return exitError
	}
	kctx, err := parser.Parse(args)
	if exit >= 0 {
		return exit // --help
	}
	if err != nil {
		fmt.Fprintln(stderr, "bdnvol:", termsafe.Text(err.Error()))
		return exitUsage
	}
	// A second SIGINT or SIGTERM exits at once (128 + signal number), for a
	// command stuck where a context does not reach.
	ctx, stop := signals.Context(func(s os.Signal) {
		fmt.Fprintf(stderr, "bdnvol: %v again: exiting now\n", s)
		os.Exit(signals.ExitCode(s))
	})
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	// ModelPack models opened by this command keep their derived file
	// index here (the CSI mounter uses its own cache directory's).
	modelpack.UseIndexCache(modelpack.OpenIndexCache(filepath.Join(cli.Globals.cacheDir(), "indexes"), 0))
	if err := kctx.Run(); err != nil {
		fmt.Fprintln(stderr, "bdnvol:", termsafe.Text(err.Error())+flagHint(err))
		var ue usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitError
	}
	return exitOK
}

// mountStore is where mounts record their state.
func (g *Globals) mountStore() mounts.Store { return mounts.DefaultStore(g.cacheDir()) }

// printJSON writes v to stdout as JSON, on one line.
func (g *Globals) printJSON(v any) error { return json.NewEncoder(g.stdout).Encode(v) }

// logf prints one "bdnvol: " line to stderr. Library code logs through it
// (retries, mirror and cache trouble), with errors that may carry registry
// or volume text: characters a terminal would act on are escaped.
func (g *Globals) logf(format string, args ...any) {
	fmt.Fprintln(g.stderr, "bdnvol:", termsafe.Text(fmt.Sprintf(format, args...)))
}

// Size is a byte count that parses suffixes such as KiB, MiB and GiB.
type Size int64

// UnmarshalText parses a size such as 4096, 64KiB or 8MiB.
func (s *Size) UnmarshalText(b []byte) error {
	n, err := units.ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// startProgress draws a progress line of c on w while work runs, if w is
// a terminal; the returned function stops it and clears the line.
func startProgress(w io.Writer, verb string, c *progress.Counters) func() {
	return progress.Start(w, verb, func() (int64, int64, int64) { return c.Total.Load(), c.Processed.Load(), c.Sent.Load() })
}
