package csi

import (
	"path/filepath"
	"time"

	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// hold protects every chunk of the mounted version vol in the node's cache
// (warming never evicts them) and records it next to the cache with a
// lease on its mountpoint (so `bdnvol cache gc` and `ls` see it in use).
// The returned func drops both.
func (m *Mounter) hold(vol *lazy.Volume, ref, pinned, mountpoint string) func() {
	ver := vol.Version()
	owner := "mount:" + ver.Root.Digest.String()
	m.opt.Cache.Protect(owner, ver.Chunks)
	store := warm.StoreOf(m.opt.Cache)
	rec, err := store.Get(ver.Root.Digest)
	if err != nil || rec.Patterns != "" {
		warmed := rec.Warmed
		rec = warm.Record{Ref: ref, Pinned: pinned, Root: ver.Root, Warmed: warmed}
		for _, c := range ver.Chunks {
			rec.Chunks = append(rec.Chunks, warm.Blob{Digest: c.Digest, Size: c.Size})
		}
	}
	rec.Used = time.Now().UTC()
	if err := store.Put(rec); err != nil {
		m.log.Warn("version record not written", "digest", ver.Root.Digest.String(), "error", err.Error())
	}
	release, err := store.Lease(ver.Root.Digest, mountpoint)
	if err != nil {
		m.log.Warn("mount lease not written", "digest", ver.Root.Digest.String(), "error", err.Error())
		release = func() {}
	}
	return func() {
		release()
		m.opt.Cache.Unprotect(owner)
	}
}

// MountSamples returns, for the metrics, each digest this mounter serves
// with the number of pods the node plugin bound to it (its target records
// under stateDir).
func (m *Mounter) MountSamples(stateDir string) []metrics.MountSample {
	pods := map[string]int{}
	for _, t := range (targets{filepath.Join(stateDir, "targets")}).all() {
		pods[t.Digest]++
	}
	var out []metrics.MountSample
	for _, i := range m.List() {
		out = append(out, metrics.MountSample{Digest: i.Digest, Pods: pods[i.Digest]})
	}
	return out
}
