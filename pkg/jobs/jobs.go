// Package jobs keeps the durable state of sync jobs on disk: one JSON file
// per job, rewritten atomically under a per-job lock, so that a job's state
// survives the process that runs it being killed.
//
// # Job
//
// A job is created QUEUED, becomes RUNNING when a process picks it up and
// records its PID, and ends SUCCEEDED (with the version reference),
// FAILED or CANCELED (with a reason). A RUNNING job whose process is gone
// is observed as FAILED ("interrupted"); FAILED and CANCELED jobs can be
// run again.
//
// # Running
//
// Store.Run runs a job's work in this process and keeps the record true
// while it does: progress every ReportInterval, a cancel request cancels
// the work's context, and the end state is recorded however the work
// ends. Spawn starts the process that runs a detached job; Wait, Cancel
// and Requeue are what the CLI's jobs commands do.
//
// # Credentials
//
// A job records what to sync, never how to authenticate: tokens come from
// the environment of the process that runs it.
package jobs

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/internal/proc"
)

// State is where a job is in its life.
type State string

// Job states.
const (
	Queued    State = "QUEUED"
	Running   State = "RUNNING"
	Succeeded State = "SUCCEEDED"
	Failed    State = "FAILED"
	Canceled  State = "CANCELED"
)

// Sentinel errors, wrapped with the job ID.
var (
	// ErrNotFound is wrapped when no job has the ID.
	ErrNotFound = errors.New("jobs: no such job")
	// ErrAmbiguous is wrapped when an ID prefix names several jobs.
	ErrAmbiguous = errors.New("jobs: ambiguous job ID")
)

// Spec is what a sync job does. It holds no credentials.
type Spec struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Include     []string `json:"include,omitempty"`
	Exclude     []string `json:"exclude,omitempty"`
	Endpoint    string   `json:"endpoint,omitempty"`
	List        bool     `json:"list,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	Jobs        int      `json:"jobs,omitempty"`
	// MaxRate bounds the bytes per second read from the source and sent
	// to the destination together; 0 for no bound.
	MaxRate int64 `json:"max_rate,omitempty"`
	// What the source's requests may reach besides public addresses, so
	// that a resumed job keeps what the user allowed.
	AllowPrivateNetwork bool `json:"allow_private_network,omitempty"`
	AllowLinkLocal      bool `json:"allow_link_local,omitempty"`

	// How to reach the destination registry (no credentials).
	PlainHTTP          bool   `json:"plain_http,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
	CAFile             string `json:"ca_file,omitempty"`
}

// Progress is what a running job last reported.
type Progress struct {
	Phase     string `json:"phase,omitempty"` // listing, transferring, tagging
	Files     int    `json:"files,omitempty"`
	Total     int64  `json:"total,omitempty"`     // bytes of the volume
	Processed int64  `json:"processed,omitempty"` // bytes read from the source and chunked
	Sent      int64  `json:"sent,omitempty"`      // bytes uploaded
}

// Job is the recorded state of one sync.
type Job struct {
	ID       string   `json:"id"`
	Spec     Spec     `json:"spec"`
	State    State    `json:"state"`
	Reason   string   `json:"reason,omitempty"`
	PID      int      `json:"pid,omitempty"`
	PIDStart string   `json:"pid_start,omitempty"` // the process's start time, against PID reuse
	Attempts int      `json:"attempts"`
	Progress Progress `json:"progress"`

	Reference     string `json:"reference,omitempty"` // REPO@sha256:… once SUCCEEDED
	Digest        string `json:"digest,omitempty"`
	Commit        string `json:"commit,omitempty"` // what the source revision resolved to
	BytesUploaded int64  `json:"bytes_uploaded,omitempty"`

	CancelRequested bool `json:"cancel_requested,omitempty"`

	Created  time.Time `json:"created"`
	Started  time.Time `json:"started,omitzero"`
	Updated  time.Time `json:"updated"`
	Finished time.Time `json:"finished,omitzero"`
}

// Done reports whether the job has ended.
func (j *Job) Done() bool {
	return j.State == Succeeded || j.State == Failed || j.State == Canceled
}

// startGrace is how long a QUEUED job may wait for its process.
const startGrace = time.Minute

// observe turns a RUNNING job whose process is gone (or a QUEUED one no
// process picked up) into the FAILED job it is.
func (j *Job) observe(now time.Time) {
	switch {
	case j.State == Running && !proc.Alive(j.PID, j.PIDStart):
		j.State = Failed
		j.Reason = fmt.Sprintf("interrupted: process %d exited without finishing", j.PID)
	case j.State == Queued && j.PID == 0 && now.Sub(j.Created) > startGrace:
		j.State = Failed
		j.Reason = "interrupted: no process started the job"
	}
}

// Store is a directory of job files.
type Store struct {
	dir string
}

// DefaultDir is $XDG_STATE_HOME/bdnvol/jobs, else ~/.local/state/bdnvol/jobs.
func DefaultDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "bdnvol", "jobs")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "bdnvol", "jobs")
	}
	return filepath.Join(os.TempDir(), "bdnvol-jobs")
}

// Open returns the store in dir, creating it.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+".json") }

// LogPath is where the job's log lines go.
func (s *Store) LogPath(id string) string { return filepath.Join(s.dir, id+".log") }

// Create records a new QUEUED job.
func (s *Store) Create(spec Spec) (*Job, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	j := &Job{ID: hex.EncodeToString(b[:]), Spec: spec, State: Queued, Created: now, Updated: now}
	if err := s.write(j); err != nil {
		return nil, err
	}
	return j, nil
}

// Resolve returns the full ID of the job that id names exactly or as a
// unique prefix.
func (s *Store) Resolve(id string) (string, error) {
	if id == "" || strings.ContainsAny(id, `/\.`) {
		return "", fmt.Errorf("%w %q", ErrNotFound, id)
	}
	if _, err := os.Stat(s.path(id)); err == nil {
		return id, nil
	}
	names, _ := filepath.Glob(filepath.Join(s.dir, id+"*.json"))
	switch len(names) {
	case 0:
		return "", fmt.Errorf("%w %q", ErrNotFound, id)
	case 1:
		return strings.TrimSuffix(filepath.Base(names[0]), ".json"), nil
	}
	return "", fmt.Errorf("%w %q (%d jobs)", ErrAmbiguous, id, len(names))
}

// Get returns the job id (or a unique prefix of it), with a RUNNING job
// whose process is gone shown as FAILED.
func (s *Store) Get(id string) (*Job, error) {
	full, err := s.Resolve(id)
	if err != nil {
		return nil, err
	}
	j, err := s.read(full)
	if err != nil {
		return nil, err
	}
	j.observe(time.Now())
	return j, nil
}

// List returns every job, newest first.
func (s *Store) List() ([]*Job, error) {
	names, err := filepath.Glob(filepath.Join(s.dir, "*.json"))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out []*Job
	for _, n := range names {
		j, err := s.read(strings.TrimSuffix(filepath.Base(n), ".json"))
		if err != nil {
			continue // being created, or not a job file
		}
		j.observe(now)
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Created.After(out[b].Created) })
	return out, nil
}

// Update reads the job, lets f change it, and writes it back atomically,
// all under the job's lock. f sees a RUNNING job whose process is gone as
// FAILED. When f returns an error nothing is written.
func (s *Store) Update(id string, f func(*Job) error) (*Job, error) {
	full, err := s.Resolve(id)
	if err != nil {
		return nil, err
	}
	unlock, err := s.lock(full)
	if err != nil {
		return nil, err
	}
	defer unlock()
	j, err := s.read(full)
	if err != nil {
		return nil, err
	}
	j.observe(time.Now())
	if err := f(j); err != nil {
		return j, err
	}
	j.Updated = time.Now().UTC()
	return j, s.write(j)
}

func (s *Store) read(id string) (*Job, error) {
	b, err := os.ReadFile(s.path(id))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w %q", ErrNotFound, id)
		}
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	var j Job
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	return &j, nil
}

// write replaces the job file atomically.
func (s *Store) write(j *Job) error {
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(s.path(j.ID), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("job %s: %w", j.ID, err)
	}
	return nil
}

// lock takes the job's exclusive lock (flock on ID.lock).
func (s *Store) lock(id string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, id+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("job %s: lock: %w", id, err)
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
