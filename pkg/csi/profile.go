package csi

import (
	"fmt"
	"log/slog"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// nodeProfiles are the startup profile options of the node's mounts and
// warming: mode, the store next to cache, and log.
func nodeProfiles(mode string, cache *chunkcache.Cache, log *slog.Logger) profile.Options {
	return profile.Options{Mode: mode, Store: profile.StoreIn(cache.Dir()), Logf: func(format string, args ...any) {
		log.Info(fmt.Sprintf(format, args...), "component", "profile")
	}}
}

// profileOptions are the startup profile options of m's mounts.
func (m *Mounter) profileOptions() profile.Options {
	if m.opt.Profile == "" || m.opt.Cache == nil {
		return profile.Options{}
	}
	return nodeProfiles(m.opt.Profile, m.opt.Cache, m.log)
}
