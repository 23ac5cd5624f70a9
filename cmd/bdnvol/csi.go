package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/bdnvol/bdnvol/pkg/csi"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/warmstate"
)

// CSICmd runs the Kubernetes CSI node plugin's two processes.
type CSICmd struct {
	Mounter CSIMounterCmd `cmd:"" help:"Hold one FUSE mount per digest on this node over one shared chunk cache; serve the node plugin on a unix socket."`
	Node    CSINodeCmd    `cmd:"" help:"Serve the CSI Identity and Node services to kubelet, mounting through the mounter."`
	// FDHolder is `bdnvol csi fd-holder`.
	FDHolder CSIFDHolderCmd `cmd:"" name:"fd-holder" help:"Keep a copy of each of the mounter's FUSE descriptors, so that mounts outlive a mounter that crashes and its successor serves them."`
}

// CSIFDHolderCmd is `bdnvol csi fd-holder`.
type CSIFDHolderCmd struct {
	Socket      string        `default:"${fd_holder_socket}" help:"The unix socket the mounter connects to (--fd-holder)."`
	DetachAfter time.Duration `name:"detach-after" default:"10s" help:"When stopped with no mounter connected, how long to wait for one before detaching the mounts held."`
	MountsDir   string        `name:"mounts-dir" default:"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounts" help:"The mounter's --mounts-dir: a mount elsewhere, or whose descriptor is not /dev/fuse, is refused."`
}

// Run holds descriptors until SIGTERM.
func (c *CSIFDHolderCmd) Run(ctx context.Context, g *Globals) error {
	return csi.ServeFDHolder(ctx, csi.FDHolderOptions{Socket: c.Socket, DetachAfter: c.DetachAfter, MountsDir: c.MountsDir,
		Logger: slog.New(slog.NewJSONHandler(g.stderr, nil)).With("component", "fd-holder")})
}

// csiDirs are the flags both processes take.
type csiDirs struct {
	StateDir      string `name:"state-dir" default:"/var/lib/bdnvol/csi" help:"Where the plugin records what it published."`
	MountsDir     string `name:"mounts-dir" default:"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounts" help:"Where the per-digest FUSE mounts live (under the kubelet directory, so propagation shares them)."`
	MounterSocket string `name:"mounter-socket" default:"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounter.sock" help:"The mounter's unix socket."`
}

// CSIMounterCmd is `bdnvol csi mounter`.
type CSIMounterCmd struct {
	csiDirs      `embed:""`
	CacheSize    Size          `name:"cache-size" default:"50GiB" help:"Bound of the chunk cache (least recently used chunks go first)."`
	HostsDir     string        `name:"hosts-dir" placeholder:"DIR" help:"containerd-style hosts directory for registry mirrors (none to disable)."`
	Jobs         int           `default:"8" help:"Concurrent background chunk fetches per mount."`
	FetchTimeout time.Duration `name:"fetch-timeout" default:"30s" help:"A read fails with EIO when a chunk takes longer to fetch."`

	WarmList            string        `name:"warm-list" placeholder:"FILE" help:"Keep the references in FILE warm in the cache (one 'REF [GLOBS]' per line; re-read when it changes)."`
	WarmBandwidth       Size          `name:"warm-bandwidth" default:"0" help:"Bytes per second warming may fetch (0: no bound)."`
	WarmResolveInterval time.Duration `name:"warm-resolve-interval" default:"5m" help:"How often tags in the warm list are resolved again."`
	WarmStatus          string        `name:"warm-status" placeholder:"FILE" help:"Where the warm status is written (default STATE-DIR/warm-status.json)."`
	WarmJobs            int           `name:"warm-jobs" default:"4" help:"Concurrent chunk fetches for warming."`
	Profile             string        `default:"auto" enum:"auto,off" help:"Startup profiles: auto fetches first, for each mount and warm, what the node's stored profile of the version, else its referrer, lists; off."`
	MetricsAddr         string        `name:"metrics-addr" placeholder:"HOST:PORT" help:"Serve Prometheus metrics (/metrics) at this address (HOST:PORT, or [HOST]:PORT for any IP; :PORT listens on every address)."`
	MetricsDigests      bool          `name:"metrics-digests" help:"Label the mount and warm metrics with digests and references, and serve the warm status at /warm: whoever reaches --metrics-addr then learns which versions this node holds."`
	FDHolder            string        `name:"fd-holder" placeholder:"SOCKET" help:"The fd holder's socket (bdnvol csi fd-holder; its default is ${fd_holder_socket}): mounts then survive a crash of the mounter, and a stop leaves them to the next mounter."`
	Handoff             string        `name:"handoff-socket" placeholder:"SOCKET" help:"Where a new mounter takes this one's mounts over (default STATE-DIR/mounter-handoff.sock)."`

	PeerListen    string   `name:"peer-listen" placeholder:"HOST:PORT" help:"Serve this node's verified chunks to the cluster's other mounters here, and ask them before the registry (the peer tier; off by default)."`
	PeerAdvertise string   `name:"peer-advertise" placeholder:"HOST:PORT" help:"This node's peer address as the others reach it (default --peer-listen)."`
	Peers         []string `name:"peers" placeholder:"HOST:PORT,..." help:"The cluster's mounters' peer addresses (static membership)."`
	PeerService   string   `name:"peer-service" placeholder:"NAMESPACE/NAME" help:"The mounters' headless Service: the membership is its ready endpoints, watched through the Kubernetes API (the pod's service account, or KUBECONFIG)."`
	PeerPortName  string   `name:"peer-port-name" default:"peer" help:"The Service port that the peer tier's endpoints listen on."`
	PeerTLSSecret string   `name:"peer-tls-secret" placeholder:"NAMESPACE/NAME" help:"A Secret holding the cluster CA of mutual TLS between mounters (ca.crt, ca.key); the first mounter fills it when empty, each issues itself a certificate."`
	PeerTLSDir    string   `name:"peer-tls-dir" type:"path" placeholder:"DIR" help:"ca.crt, tls.crt and tls.key: mutual TLS between mounters (certificates of one cluster CA)."`
	PeerInsecure  bool     `name:"peer-insecure" help:"Allow plain HTTP between mounters without --peer-tls-dir (tests; a node network you vouch for)."`
}

// Run serves until SIGTERM, then unmounts everything (or leaves it to the
// fd holder).
func (c *CSIMounterCmd) Run(ctx context.Context, g *Globals) error {
	// The global --cache-dir names the node's chunk cache, shared by every mount.
	return csi.ServeMounter(ctx, csi.MounterProcess{
		Socket: c.MounterSocket, MountsDir: c.MountsDir, StateDir: c.StateDir, CacheDir: g.CacheDir, CacheSize: int64(c.CacheSize),
		OCI: g.options(), Mirrors: oci.MirrorConfig{HostsDir: c.HostsDir, CAFile: g.CAFile, SkipVerify: g.InsecureSkipVerify},
		Jobs: c.Jobs, FetchTimeout: c.FetchTimeout,
		WarmList: c.WarmList, WarmStatus: c.WarmStatus, WarmBandwidth: int64(c.WarmBandwidth),
		WarmResolveInterval: c.WarmResolveInterval, WarmJobs: c.WarmJobs, Profile: c.Profile,
		MetricsAddr: c.MetricsAddr, MetricsDigests: c.MetricsDigests, FDHolder: c.FDHolder, Handoff: c.Handoff, Version: version, Logger: slog.New(slog.NewJSONHandler(g.stderr, nil)).With("component", "mounter"),
		Peers: csi.PeerConfig{Listen: c.PeerListen, Advertise: c.PeerAdvertise, Peers: c.Peers, TLSDir: c.PeerTLSDir, Insecure: c.PeerInsecure,
			Service: c.PeerService, PortName: c.PeerPortName, TLSSecret: c.PeerTLSSecret},
	})
}

// CSINodeCmd is `bdnvol csi node`.
type CSINodeCmd struct {
	csiDirs  `embed:""`
	KeyDir   string        `name:"key-dir" type:"path" placeholder:"DIR" help:"Directory of cosign public keys that a volume's requireSignature may name by file name (default none: keys inline as PEM only)."`
	Endpoint string        `default:"unix:///csi/csi.sock" help:"The CSI socket kubelet calls."`
	NodeID   string        `name:"node-id" env:"NODE_NAME" help:"This node's name (default: the host name)."`
	Linger   time.Duration `default:"2m" help:"How long a digest stays mounted after its last pod is gone."`
	// KubeletDir confines target paths.
	KubeletDir string `name:"kubelet-dir" default:"/var/lib/kubelet" help:"The kubelet's root directory: volumes are published only beneath it."`
	// WarmstateField and WarmstateNvidiaSMI give the node's warm-state key fields.
	WarmstateField     []string `name:"warmstate-field" placeholder:"NAME=VALUE" help:"A warm-state key field of this node (gpu, cc, driver, …), added to every warmstateKey that lacks it; a key naming another value is refused (repeatable)."`
	WarmstateNvidiaSMI bool     `name:"warmstate-nvidia-smi" help:"Take the node's gpu, cc and driver key fields from nvidia-smi at start."`
	WarmstatePublish   bool     `name:"warmstate-publish" help:"Let a warm-state volume's warmstatePublish publish what its pod wrote, with this node's registry credentials: only where pods are trusted to write caches others run, or readers require signatures."`
	// WarmstateLowerTTL and WarmstateMaxBytes bound the node's warm state.
	WarmstateLowerTTL time.Duration `name:"warmstate-lower-ttl" default:"1h" help:"Remove a companion's directory on this node once no pod has used it for this long."`
	WarmstateMaxBytes Size          `name:"warmstate-max-bytes" default:"64GiB" help:"Publish no pod layer holding more bytes than this (the pod's cache is dropped, logged)."`
	// WarmList names warm-state companions to pull ahead of pods.
	WarmList         string        `name:"warm-list" placeholder:"FILE" help:"Pull the warm-state companions FILE names ('REF warmstate:KEY' lines of the warm list) onto this node ahead of pods."`
	WarmListInterval time.Duration `name:"warm-list-interval" default:"1m" help:"How often --warm-list is read and its companions looked up."`
}

// Run serves the CSI services until SIGTERM.
func (c *CSINodeCmd) Run(ctx context.Context, g *Globals) error {
	fields, err := warmstate.NodeFields(c.WarmstateField)
	if err != nil {
		return usageError{fmt.Errorf("--warmstate-field: %w", err)}
	}
	if c.WarmstateNvidiaSMI {
		smi, err := warmstate.NvidiaSMI(ctx, "")
		if err != nil {
			return err
		}
		if fields, err = fields.Complete(smi); err != nil {
			return usageError{fmt.Errorf("--warmstate-field and nvidia-smi: %w", err)}
		}
	}
	if c.KeyDir != "" {
		if fi, err := os.Stat(c.KeyDir); err != nil {
			return usageError{fmt.Errorf("--key-dir: %w", err)}
		} else if !fi.IsDir() {
			return usageError{fmt.Errorf("--key-dir %s: not a directory", c.KeyDir)}
		}
	}
	return csi.ServeNode(ctx, c.Endpoint, csi.NodeOptions{
		NodeID: c.NodeID, Version: version, StateDir: c.StateDir, Linger: c.Linger, KubeletDir: c.KubeletDir, MountsDir: c.MountsDir,
		Mounter: csi.NewMounterClient(c.MounterSocket), OCI: g.options(),
		KeyDir: c.KeyDir, Logger: slog.New(slog.NewJSONHandler(g.stderr, nil)).With("component", "node"),
		WarmstateFields: fields, WarmstatePublish: c.WarmstatePublish,
		WarmstateLowerTTL: c.WarmstateLowerTTL, WarmstateMaxBytes: int64(c.WarmstateMaxBytes),
		WarmList: c.WarmList, WarmListInterval: c.WarmListInterval,
	})
}
