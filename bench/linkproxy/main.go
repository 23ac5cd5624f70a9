// Command linkproxy is an HTTP reverse proxy that makes a loopback registry
// look like one across a real link: it waits a fixed time before passing on
// each request and caps each response body (and each request body) at a
// fixed rate per request, and, with -total, all response bodies together at
// one rate (a shared link); with -corrupt it flips the first byte of every
// response body (a lying peer in front of a mounter). For benchmarks only.
//
//	linkproxy -listen 127.0.0.1:0 -target http://127.0.0.1:5000 -delay 20ms -rate 50MB
//
// It prints the address it listens on as its first line of stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bdnvol/bdnvol/internal/ratelimit"
)

// piece is the most bytes paced passes on at once, and the size of the
// proxy's copy buffers: large enough that the proxy, which shares the
// machine's CPUs with the client it measures, costs little per byte; small
// enough (5 ms at 50 MB/s) that the rate holds within a request.
const piece = 256 << 10

// bufPool hands the reverse proxy piece-sized copy buffers.
type bufPool struct{ p sync.Pool }

func (b *bufPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, piece)
}

func (b *bufPool) Put(v []byte) { b.p.Put(&v) }

// Counters of what went through the proxy, printed to stderr on SIGUSR1.
var requests, sent atomic.Int64

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	target := flag.String("target", "", "registry base URL, e.g. http://127.0.0.1:5000")
	delay := flag.Duration("delay", 20*time.Millisecond, "wait before passing on each request")
	rate := flag.String("rate", "50MB", "bytes per second per request body, each way (suffix KB, MB, GB: powers of 1000)")
	logPath := flag.String("log", "", "file to append one line per request to: arrival and end (Unix seconds), method, path, Range, bytes sent")
	totalRate := flag.String("total", "", "bytes per second of all response bodies together, a shared link (suffix KB, MB, GB); none by default")
	corrupt := flag.Bool("corrupt", false, "flip the first byte of every response body (a peer that lies)")
	flag.Parse()
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		log.Fatalf("linkproxy: -target %q: want a base URL", *target)
	}
	bps, err := parseRate(*rate)
	if err != nil {
		log.Fatalf("linkproxy: -rate: %v", err)
	}
	var shared *ratelimit.Limiter
	if *totalRate != "" {
		tb, err := parseRate(*totalRate)
		if err != nil {
			log.Fatalf("linkproxy: -total: %v", err)
		}
		shared = ratelimit.New(int64(tb))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("linkproxy: %v", err)
	}
	fmt.Println(ln.Addr().String())
	os.Stdout.Sync()
	var reqLog *requestLog
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatalf("linkproxy: -log: %v", err)
		}
		reqLog = &requestLog{w: f}
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	rp.FlushInterval = -1
	rp.BufferPool = &bufPool{}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			fmt.Fprintf(os.Stderr, "requests %d bytes %d\n", requests.Load(), sent.Load())
		}
	}()
	rp.ModifyResponse = func(resp *http.Response) error {
		p := &paced{ctx: resp.Request.Context(), r: resp.Body, bps: bps, start: time.Now(), count: &sent, shared: shared, flip: *corrupt}
		if reqLog != nil {
			p.done = func(n int64) { reqLog.add(resp.Request, n) }
		}
		resp.Body = p
		return nil
	}
	director := rp.Director
	rp.Director = func(r *http.Request) {
		host := r.Host
		director(r)
		r.Host = host // the registry's Location headers come back through the proxy
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if reqLog != nil {
			r = r.WithContext(context.WithValue(r.Context(), startKey{}, time.Now()))
		}
		select {
		case <-time.After(*delay):
		case <-r.Context().Done():
			return
		}
		if r.Body != nil && r.ContentLength != 0 {
			r.Body = &paced{ctx: r.Context(), r: r.Body, bps: bps, start: time.Now()}
		}
		rp.ServeHTTP(w, r)
	})
	log.Fatal(http.Serve(ln, h))
}

// paced reads from r no faster than bps bytes per second since start.
type paced struct {
	ctx   context.Context
	r     io.ReadCloser
	bps   float64
	start time.Time
	n     int64
	count *atomic.Int64 // bytes read, when not nil
	timer *time.Timer
	done  func(n int64) // called once with the bytes read, at Close, when not nil
	// shared, when not nil, paces every response body together (-total).
	shared *ratelimit.Limiter
	// flip inverts the body's first byte (-corrupt).
	flip bool
}

func (p *paced) Read(b []byte) (int, error) {
	if len(b) > piece {
		b = b[:piece]
	}
	n, err := p.r.Read(b)
	if p.flip && n > 0 {
		b[0] ^= 0xff
		p.flip = false
	}
	if p.shared != nil && n > 0 {
		if werr := p.shared.Wait(p.ctx, int64(n)); werr != nil {
			return n, werr
		}
	}
	p.n += int64(n)
	if p.count != nil {
		p.count.Add(int64(n))
	}
	due := p.start.Add(time.Duration(float64(p.n) / p.bps * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		if p.timer == nil {
			p.timer = time.NewTimer(d)
		} else {
			p.timer.Reset(d)
		}
		select {
		case <-p.timer.C:
		case <-p.ctx.Done():
			return n, p.ctx.Err()
		}
	}
	return n, err
}

func (p *paced) Close() error {
	if p.done != nil {
		p.done(p.n)
		p.done = nil
	}
	return p.r.Close()
}

// startKey keys the time a request arrived in its context.
type startKey struct{}

// requestLog writes one line per request: arrival and end in Unix
// seconds (so that they line up with other tools' clocks), method, path,
// Range header and response bytes.
type requestLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *requestLog) add(r *http.Request, n int64) {
	start, _ := r.Context().Value(startKey{}).(time.Time)
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "%.6f %.6f %s %s range=%q bytes=%d\n", float64(start.UnixMicro())/1e6,
		float64(time.Now().UnixMicro())/1e6, r.Method, r.URL.Path, r.Header.Get("Range"), n)
}

func parseRate(s string) (float64, error) {
	mult := 1.0
	for _, u := range []struct {
		suf string
		m   float64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad rate %q", s)
	}
	return v * mult, nil
}
