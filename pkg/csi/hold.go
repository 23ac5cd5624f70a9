package csi

import (
	"path/filepath"

	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/metrics"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// hold records the mounted version vol next to the cache and protects its
// chunks (see warm.Hold); the returned func drops both.
func (m *Mounter) hold(vol *lazy.Volume, ref, pinned, mountpoint string) func() {
	release, err := warm.Hold(m.opt.Cache, vol.Version(), ref, pinned, mountpoint)
	if err != nil {
		m.log.Warn("version record or lease not written", "digest", vol.Root().Digest.String(), "error", err.Error())
	}
	return release
}

// MountSamples returns, for the metrics, each mount this mounter serves
// with the number of pods the node plugin bound to it (its target records
// under stateDir).
func (m *Mounter) MountSamples(stateDir string) []metrics.MountSample {
	pods := map[string]int{}
	for _, t := range (targets{filepath.Join(stateDir, "targets")}).all() {
		pods[targetKey(t)]++
	}
	var out []metrics.MountSample
	for _, i := range m.List() {
		out = append(out, metrics.MountSample{Digest: i.Digest, Pods: pods[infoKey(i)]})
	}
	return out
}
