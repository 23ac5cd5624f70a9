// Package metrics is the Prometheus metrics of the mounter and of
// `bdnvol mount`: the chunk cache, fetches by registry and by mirror,
// mounts and pods per digest, and the warm status per version.
package metrics

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// Metrics is one process's registry of bdnvol metrics.
type Metrics struct {
	reg *prometheus.Registry

	fetchSeconds *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	regBytes     *prometheus.CounterVec
	regFetches   *prometheus.CounterVec
	regErrors    *prometheus.CounterVec

	mu       sync.Mutex
	regTotal float64 // bytes from registries, for the mirror share
}

// New returns a registry with the process and Go runtime collectors and
// the fetch metrics.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.fetchSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "bdnvol_fetch_duration_seconds", Help: "Time to fetch one blob, from the request to its last byte, by source and host.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	}, []string{"source", "host"})
	m.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "bdnvol_fetches_in_flight", Help: "Blob fetches under way, by source and host.",
	}, []string{"source", "host"})
	m.regBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bdnvol_registry_fetched_bytes_total", Help: "Bytes fetched from the registry itself (not a mirror), by registry host and kind (blob or manifest).",
	}, []string{"host", "kind"})
	m.regFetches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bdnvol_registry_fetches_total", Help: "Fetches sent to the registry itself, by registry host and kind (blob or manifest).",
	}, []string{"host", "kind"})
	m.regErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bdnvol_registry_fetch_errors_total", Help: "Blob fetches from the registry that failed, by registry host.",
	}, []string{"host"})
	m.reg.MustRegister(m.fetchSeconds, m.inFlight, m.regBytes, m.regFetches, m.regErrors)
	return m
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry returns the underlying registry.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Cache exports the counters of the node's chunk cache: hits, misses,
// bytes served and fetched (by registry and by mirror), evictions, size
// and verification failures.
func (m *Metrics) Cache(c *chunkcache.Cache) {
	for _, k := range cacheCounters {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: k.name, Help: k.help},
			func() float64 { return float64(k.stat(c.Stats())) }))
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bdnvol_cache_size_bytes", Help: "Bytes in the node's chunk cache."},
			func() float64 { return float64(c.Size()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bdnvol_cache_max_bytes", Help: "The bound of the node's chunk cache."},
			func() float64 { return float64(c.Max()) }),
		&fetchedCollector{m: m, c: c},
	)
	for how, n := range map[string]func(modelpack.Counts) int64{
		"published": func(c modelpack.Counts) int64 { return c.Published },
		"derived":   func(c modelpack.Counts) int64 { return c.Derived },
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bdnvol_modelpack_indexes_total",
			Help:        "ModelPack models opened: from a signed published index (how=published), or by reading every layer whole (how=derived).",
			ConstLabels: prometheus.Labels{"how": how}},
			func() float64 { return float64(n(modelpack.OpenCounts())) }))
	}
}

// cacheCounters are the counters of the chunk cache's Stats, by name.
var cacheCounters = []struct {
	name, help string
	stat       func(chunkcache.Stats) int64
}{
	{"bdnvol_cache_hits_total", "Chunk loads served from the node's cache.",
		func(s chunkcache.Stats) int64 { return s.Hits }},
	{"bdnvol_cache_misses_total", "Chunk loads that fetched the chunk (from a mirror or the registry) and verified it.",
		func(s chunkcache.Stats) int64 { return s.Fetches }},
	{"bdnvol_cache_served_bytes_total", "Bytes of chunk loads served from the cache.",
		func(s chunkcache.Stats) int64 { return s.HitBytes }},
	{"bdnvol_cache_evictions_total", "Chunks evicted to keep the cache within its bound.",
		func(s chunkcache.Stats) int64 { return s.Evictions }},
	{"bdnvol_verification_failures_total", "Fetched chunks or cache entries whose bytes did not match their digest.",
		func(s chunkcache.Stats) int64 { return s.Corrupt }},
	{"bdnvol_cache_store_errors_total", "Verified chunks that could not be written to the cache (disk full).",
		func(s chunkcache.Stats) int64 { return s.StoreErrors }},
}

// fetchedCollector splits the verified bytes the cache fetched into those
// from registries and those from mirrors.
type fetchedCollector struct {
	m *Metrics
	c *chunkcache.Cache
}

var fetchedDesc = prometheus.NewDesc("bdnvol_fetched_bytes_total",
	"Verified chunk bytes fetched into the cache, by source (registry or mirror).", []string{"source"}, nil)

func (f *fetchedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- fetchedDesc }

func (f *fetchedCollector) Collect(ch chan<- prometheus.Metric) {
	all := float64(f.c.Stats().FetchedBytes)
	f.m.mu.Lock()
	reg := f.m.regTotal
	f.m.mu.Unlock()
	reg = min(reg, all)
	ch <- prometheus.MustNewConstMetric(fetchedDesc, prometheus.CounterValue, reg, "registry")
	ch <- prometheus.MustNewConstMetric(fetchedDesc, prometheus.CounterValue, all-reg, "mirror")
}

// Wrap returns f instrumented as source ("registry") at host: fetch
// latency, in-flight fetches, bytes and errors. When f fetches byte ranges
// (oci.RangeFetcher) so does the result, instrumented the same way: a
// reader of part of a blob through it fetches that part, not the blob.
func (m *Metrics) Wrap(source, host string, f content.Fetcher) content.Fetcher {
	w := &fetcher{m: m, src: f, source: source, host: host}
	if rf, ok := f.(oci.RangeFetcher); ok {
		return &rangeFetcher{fetcher: w, rf: rf}
	}
	return w
}

type fetcher struct {
	m            *Metrics
	src          content.Fetcher
	source, host string
}

func (f *fetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return f.instrument(desc, func() (io.ReadCloser, error) { return f.src.Fetch(ctx, desc) })
}

// instrument counts one fetch of desc made by get.
func (f *fetcher) instrument(desc ocispec.Descriptor, get func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	g := f.m.inFlight.WithLabelValues(f.source, f.host)
	g.Inc()
	start := time.Now()
	kind := kindOf(desc.MediaType)
	f.m.regFetches.WithLabelValues(f.host, kind).Inc()
	rc, err := get()
	if err != nil {
		g.Dec()
		f.m.regErrors.WithLabelValues(f.host).Inc()
		return nil, err
	}
	return &countingBody{ReadCloser: rc, f: f, kind: kind, start: start, gauge: g}, nil
}

// rangeFetcher is a fetcher whose source also fetches byte ranges.
type rangeFetcher struct {
	*fetcher
	rf oci.RangeFetcher
}

var _ oci.RangeFetcher = (*rangeFetcher)(nil)

// FetchRange fetches n bytes at off of desc from the source, counted as a
// fetch of desc.
func (f *rangeFetcher) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	return f.instrument(desc, func() (io.ReadCloser, error) { return f.rf.FetchRange(ctx, desc, off, n) })
}

// kindOf is "manifest" for manifest and index media types, else "blob".
func kindOf(mediaType string) string {
	switch mediaType {
	case ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex,
		"application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json":
		return "manifest"
	}
	return "blob"
}

type countingBody struct {
	io.ReadCloser
	f     *fetcher
	kind  string
	start time.Time
	gauge prometheus.Gauge
	n     int64
	once  sync.Once
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		b.gauge.Dec()
		b.f.m.fetchSeconds.WithLabelValues(b.f.source, b.f.host).Observe(time.Since(b.start).Seconds())
		b.f.m.regBytes.WithLabelValues(b.f.host, b.kind).Add(float64(b.n))
		b.f.m.mu.Lock()
		b.f.m.regTotal += float64(b.n)
		b.f.m.mu.Unlock()
	})
	return err
}

// MountSample is one mount a process serves.
type MountSample struct {
	Digest string
	Pods   int // pods (targets) bound to it; 0 while it lingers
}

var (
	mountsDesc         = prometheus.NewDesc("bdnvol_mounts", "FUSE mounts served.", nil, nil)
	podsDesc           = prometheus.NewDesc("bdnvol_pods", "Pods (published targets) reading the mounts.", nil, nil)
	mountsByDigestDesc = prometheus.NewDesc("bdnvol_mounts", "FUSE mounts served, by digest (one per repository the digest is mounted from).", []string{"digest"}, nil)
	podsByDigestDesc   = prometheus.NewDesc("bdnvol_pods", "Pods (published targets) reading each digest's mounts.", []string{"digest"}, nil)
)

// Mounts exports bdnvol_mounts and bdnvol_pods from list: totals, or per
// digest when digests is set. A digest label tells whoever can scrape
// which versions are mounted on the node, and the digest is all a pod
// needs to name a version in a pod spec.
func (m *Metrics) Mounts(list func() []MountSample, digests bool) {
	if !digests {
		m.reg.MustRegister(collectorFunc{descs: []*prometheus.Desc{mountsDesc, podsDesc}, collect: func(ch chan<- prometheus.Metric) {
			ss := list()
			pods := 0
			for _, s := range ss {
				pods += s.Pods
			}
			ch <- prometheus.MustNewConstMetric(mountsDesc, prometheus.GaugeValue, float64(len(ss)))
			ch <- prometheus.MustNewConstMetric(podsDesc, prometheus.GaugeValue, float64(pods))
		}})
		return
	}
	m.reg.MustRegister(collectorFunc{descs: []*prometheus.Desc{mountsByDigestDesc, podsByDigestDesc}, collect: func(ch chan<- prometheus.Metric) {
		var order []string
		mounts, pods := map[string]int{}, map[string]int{}
		for _, s := range list() {
			if mounts[s.Digest] == 0 {
				order = append(order, s.Digest)
			}
			mounts[s.Digest]++
			pods[s.Digest] += s.Pods
		}
		for _, d := range order {
			ch <- prometheus.MustNewConstMetric(mountsByDigestDesc, prometheus.GaugeValue, float64(mounts[d]), d)
			ch <- prometheus.MustNewConstMetric(podsByDigestDesc, prometheus.GaugeValue, float64(pods[d]), d)
		}
	}})
}

var (
	warmStateDesc   = prometheus.NewDesc("bdnvol_warm_state", "Warm list entries by reference, digest and state (warm, warming, does-not-fit, error, resolving); 1 for the current state.", []string{"ref", "digest", "state"}, nil)
	warmBytesDesc   = prometheus.NewDesc("bdnvol_warm_bytes", "Bytes a warm list entry needs.", []string{"ref", "digest"}, nil)
	warmCachedDesc  = prometheus.NewDesc("bdnvol_warm_cached_bytes", "Bytes of a warm list entry in the cache.", []string{"ref", "digest"}, nil)
	warmFitsDesc    = prometheus.NewDesc("bdnvol_warm_list_fits", "1 when the whole warm list fits in the cache with the mounted versions.", nil, nil)
	warmEntriesDesc = prometheus.NewDesc("bdnvol_warm_entries", "Warm list entries in each state (warm, warming, does-not-fit, error, resolving).", []string{"state"}, nil)
)

// warmStates are the states a warm list entry can be in.
var warmStates = []string{warm.StateWarm, warm.StateWarming, warm.StateNoFit, warm.StateError, warm.StateResolving}

// Warm exports the warm status from status: whether the list fits and the
// entries in each state, and with digests set each entry by reference and
// digest.
func (m *Metrics) Warm(status func() warm.Status, digests bool) {
	descs := []*prometheus.Desc{warmFitsDesc, warmEntriesDesc}
	if digests {
		descs = append(descs, warmStateDesc, warmBytesDesc, warmCachedDesc)
	}
	m.reg.MustRegister(collectorFunc{descs: descs, collect: func(ch chan<- prometheus.Metric) {
		st := status()
		fits := 0.0
		if st.Fits {
			fits = 1
		}
		ch <- prometheus.MustNewConstMetric(warmFitsDesc, prometheus.GaugeValue, fits)
		states := map[string]int{}
		for _, e := range st.Entries {
			states[e.State]++
		}
		for _, s := range warmStates {
			ch <- prometheus.MustNewConstMetric(warmEntriesDesc, prometheus.GaugeValue, float64(states[s]), s)
		}
		if !digests {
			return
		}
		for _, e := range st.Entries {
			ch <- prometheus.MustNewConstMetric(warmStateDesc, prometheus.GaugeValue, 1, e.Ref, e.Digest, e.State)
			ch <- prometheus.MustNewConstMetric(warmBytesDesc, prometheus.GaugeValue, float64(e.Bytes), e.Ref, e.Digest)
			ch <- prometheus.MustNewConstMetric(warmCachedDesc, prometheus.GaugeValue, float64(e.Cached), e.Ref, e.Digest)
		}
	}})
}

// collectorFunc is a collector of const metrics made at scrape time.
type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// PeerSample is what the peer tier of a node did (pkg/peer), in bytes.
type PeerSample struct {
	FromPeers, FromSource int64 // chunk bytes read from peers, and from registries (behind mirrors)
	ServedToPeers         int64 // chunk bytes served to peers
	PeerFailures, Refused int64 // peer answers that failed here; requests this node refused
	Members               int64 // the cluster's mounters this node knows, itself included when listed
}

// Peers exports the peer tier's counters, read from sample at each scrape.
func (m *Metrics) Peers(sample func() PeerSample) {
	for _, c := range []struct {
		name, help string
		labels     prometheus.Labels
		v          func(PeerSample) int64
	}{
		{"bdnvol_peer_read_bytes_total", "Chunk bytes mounts read, by source: peer or registry (behind its mirrors).", prometheus.Labels{"source": "peer"}, func(s PeerSample) int64 { return s.FromPeers }},
		{"bdnvol_peer_read_bytes_total", "Chunk bytes mounts read, by source: peer or registry (behind its mirrors).", prometheus.Labels{"source": "registry"}, func(s PeerSample) int64 { return s.FromSource }},
		{"bdnvol_peer_served_bytes_total", "Chunk bytes served to peers.", nil, func(s PeerSample) int64 { return s.ServedToPeers }},
		{"bdnvol_peer_failures_total", "Peer answers that failed (error, too slow, wrong bytes): the peer is skipped a while.", nil, func(s PeerSample) int64 { return s.PeerFailures }},
		{"bdnvol_peer_refused_total", "Peer requests this node refused (not held, no mount of the origin, busy, malformed).", nil, func(s PeerSample) int64 { return s.Refused }},
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help, ConstLabels: c.labels},
			func() float64 { return float64(c.v(sample())) }))
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bdnvol_peer_members",
		Help: "The cluster's mounters this node knows as peers (from --peers or the Service's EndpointSlices)."},
		func() float64 { return float64(sample().Members) }))
}
