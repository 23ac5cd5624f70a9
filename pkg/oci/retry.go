package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// RetryPolicy bounds how a request is retried on connection errors, 408,
// 429 and 5xx answers. Zero values select the defaults.
type RetryPolicy struct {
	MaxAttempts int           // attempts in all; <= 0 means 6
	Base        time.Duration // first backoff; <= 0 means 200ms
	MaxWait     time.Duration // longest single wait, Retry-After included; <= 0 means 30s
}

// retryTransport retries idempotent-safe requests: those without a body or
// whose body can be replayed (GetBody).
type retryTransport struct {
	base   http.RoundTripper
	policy RetryPolicy
}

// NewRetryTransport wraps base with retries following p.
func NewRetryTransport(base http.RoundTripper, p RetryPolicy) http.RoundTripper {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 6
	}
	if p.Base <= 0 {
		p.Base = 200 * time.Millisecond
	}
	if p.MaxWait <= 0 {
		p.MaxWait = 30 * time.Second
	}
	return &retryTransport{base: base, policy: p}
}

// RetryError is returned when a request failed on every attempt.
type RetryError struct {
	Method, URL string
	Attempts    int
	Last        error // the last transport error, or nil
	Status      int   // the last status, when there was an answer
}

// Error describes the final failure.
func (e *RetryError) Error() string {
	if e.Last != nil {
		return fmt.Sprintf("%s %s: giving up after %d attempts: %v", e.Method, e.URL, e.Attempts, e.Last)
	}
	return fmt.Sprintf("%s %s: giving up after %d attempts: last answer %d %s", e.Method, e.URL, e.Attempts, e.Status, http.StatusText(e.Status))
}

// Unwrap returns the last transport error.
func (e *RetryError) Unwrap() error { return e.Last }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	for attempt := 1; ; attempt++ {
		resp, err := t.base.RoundTrip(req)
		retry, wait := t.shouldRetry(resp, err, attempt)
		if !retry || !replayable {
			return resp, err
		}
		if attempt >= t.policy.MaxAttempts {
			if err != nil {
				return nil, &RetryError{Method: req.Method, URL: redactURL(req), Attempts: attempt, Last: err}
			}
			return resp, nil // the caller sees the final status and its body
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, gerr
			}
			req.Body = body
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, ctx.Err()
		case <-timer.C:
		}
	}
}

// shouldRetry decides whether to try again and how long to wait first.
func (t *retryTransport) shouldRetry(resp *http.Response, err error, attempt int) (bool, time.Duration) {
	backoff := t.policy.Base << min(attempt-1, 16)
	backoff = backoff/2 + rand.N(backoff/2+1) // jitter
	if err != nil {
		if !transientError(err) {
			return false, 0
		}
		return true, min(backoff, t.policy.MaxWait)
	}
	switch s := resp.StatusCode; {
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		if ra := retryAfter(resp.Header.Get("Retry-After")); ra > 0 {
			backoff = ra
		}
	case s == http.StatusRequestTimeout || s == http.StatusBadGateway || s == http.StatusGatewayTimeout || s == http.StatusInternalServerError:
	default:
		return false, 0
	}
	return true, min(backoff, t.policy.MaxWait)
}

// transientError reports whether a transport error may go away on retry.
func transientError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// retryAfter parses a Retry-After value: seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}

// redactURL returns the request URL without credentials or query.
func redactURL(req *http.Request) string {
	u := *req.URL
	u.User = nil
	u.RawQuery = ""
	return u.String()
}
