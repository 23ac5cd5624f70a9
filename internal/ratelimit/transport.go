package ratelimit

import "net/http"

// rateTransport paces the request and response bodies of every round trip
// through one limiter.
type rateTransport struct {
	base http.RoundTripper
	l    *Limiter
}

// Transport returns base with the bodies it sends and receives paced by l,
// all requests together; base itself when l is nil. Placed below a retry
// transport, a retried request's bytes are paced again.
func Transport(base http.RoundTripper, l *Limiter) http.RoundTripper {
	if l == nil {
		return base
	}
	return &rateTransport{base: base, l: l}
}

// RoundTrip sends req with its body paced and paces the answer's body.
func (t *rateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		r := req.Clone(req.Context())
		r.Body = t.l.Reader(req.Context(), req.Body)
		req = r
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = t.l.Reader(req.Context(), resp.Body)
	}
	return resp, nil
}
