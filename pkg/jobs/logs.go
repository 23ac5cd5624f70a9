package jobs

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"time"
)

// logPoll is how often CopyLog looks for more of a running job's log.
const logPoll = 250 * time.Millisecond

// CopyLog copies the log of job id (an ID or a unique prefix) to w. With
// follow it keeps copying until the job ends or ctx is done. A job that
// has logged nothing yet has an empty log.
func (s *Store) CopyLog(ctx context.Context, id string, w io.Writer, follow bool) error {
	id, err := s.Resolve(id)
	if err != nil {
		return err
	}
	f, err := os.Open(s.LogPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		if _, err := io.Copy(w, f); err != nil {
			return err
		}
		if !follow {
			return nil
		}
		j, err := s.Get(id)
		if err != nil {
			return err
		}
		if j.Done() {
			_, err := io.Copy(w, f)
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPoll):
		}
	}
}
