package statcache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
)

// LastPush is what a node remembers of the last version it pushed to a
// repository: the directory it sealed and the version's digest. A push
// with deltas against that version reads its bases from that directory,
// where they still verify, instead of downloading them.
type LastPush struct {
	Dir    string        `json:"dir"`
	Digest digest.Digest `json:"digest"`
}

// maxLastPushBytes bounds the record a node reads back.
const maxLastPushBytes = 64 << 10

func lastPushPath(cacheDir, repo string) string {
	h := sha256.Sum256([]byte(repo))
	return filepath.Join(cacheDir, "pushes", hex.EncodeToString(h[:16])+".json")
}

// LoadLastPush returns the last push to repo recorded in cacheDir, if any.
func LoadLastPush(cacheDir, repo string) (LastPush, bool) {
	var l LastPush
	f, err := os.Open(lastPushPath(cacheDir, repo))
	if err != nil {
		return l, false
	}
	defer f.Close()
	b := make([]byte, maxLastPushBytes+1)
	n, _ := f.Read(b)
	if n > maxLastPushBytes || json.Unmarshal(b[:n], &l) != nil || l.Dir == "" || l.Digest.Validate() != nil {
		return LastPush{}, false
	}
	return l, true
}

// SaveLastPush records in cacheDir that dir was pushed to repo as d.
func SaveLastPush(cacheDir, repo, dir string, d digest.Digest) error {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	b, err := json.Marshal(LastPush{Dir: dir, Digest: d})
	if err != nil {
		return err
	}
	p := lastPushPath(cacheDir, repo)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(p, b, 0o644)
}
