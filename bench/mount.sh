#!/usr/bin/env bash
# bench/mount.sh — lazy mount benchmarks on a synthetic checkpoint.
#
# Starts a CNCF distribution registry on a free loopback port, generates a
# ~2 GiB safetensors checkpoint, pushes it with bdnvol and with oras, and
# measures:
#   first tensor: time from `bdnvol mount` start (cold chunk cache) to the
#     end of reading one tensor in the middle of the last shard (ls + header
#     + tensor), against one HTTP range GET of that tensor (curl, from the
#     oras copy of the shard) and against a full `oras pull`;
#   cold cat: `cat` of every file through a fresh mount (empty cache) against
#     `bdnvol pull --no-cache` of the same version;
#   warm cat: `cat` through a new mount whose chunk cache holds everything,
#     against the FUSE limit: a minimal go-fuse file system that serves one
#     file of the same size from memory, with the same 1 MiB read size.
# Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment: BENCH_SIZE (2GiB), BENCH_SHARDS (4), BENCH_TOOLS, BENCH_TMPDIR,
# BENCH_KEEP=1, BENCH_STRICT=1 (exit 1 when a target is missed): as in
# bench/bench.sh. BENCH_LINK=1 measures everything after the pushes through
# bench/linkproxy (BENCH_DELAY, default 20ms before each request;
# BENCH_RATE, default 50MB/s per request body): the realistic link.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
SIZE=${BENCH_SIZE:-2GiB}
SHARDS=${BENCH_SHARDS:-4}
ORAS_VERSION=v1.3.6
REGISTRY_VERSION=v3.1.2

log() { printf 'bench/mount: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b - a) / 1e9}'; }

mkdir -p "$BIN"
command -v fusermount3 >/dev/null || [[ $(id -u) == 0 ]] || die "needs fusermount3 (apt-get install fuse3) or root"
[[ -e /dev/fuse ]] || die "no /dev/fuse"
command -v curl >/dev/null || die "needs curl"
command -v python3 >/dev/null || die "needs python3"

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool oras "oras.land/oras/cmd/oras@$ORAS_VERSION" "Version:    ${ORAS_VERSION#v}" version
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
ORAS=$BIN/oras
REGISTRY=$BIN/registry
log "building synth and bdnvol"
(cd "$ROOT/e2e" && go build -o "$BIN/synth" ./cmd/synth) || die "building e2e/cmd/synth failed"
(cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol) || die "building bdnvol failed"
BDNVOL=$BIN/bdnvol

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench-mount.XXXXXX")
REG_PID=
FUSE_PID=
MOUNTS=()
cleanup() {
	local mp
	for mp in "${MOUNTS[@]}"; do
		if mountpoint -q "$mp" 2>/dev/null; then
			"$BDNVOL" umount "$mp" >/dev/null 2>&1 || fusermount3 -u -z "$mp" 2>/dev/null || true
		fi
	done
	[[ -n $FUSE_PID ]] && { kill "$FUSE_PID" 2>/dev/null || true; wait "$FUSE_PID" 2>/dev/null || true; }
	[[ -n $REG_PID ]] && { kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; }
	[[ -n ${LINK_PID:-} ]] && { kill "$LINK_PID" 2>/dev/null || true; wait "$LINK_PID" 2>/dev/null || true; }
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export XDG_CACHE_HOME=$TMP/xdg XDG_RUNTIME_DIR=$TMP/run DOCKER_CONFIG=$TMP/docker
mkdir -p "$XDG_CACHE_HOME" "$XDG_RUNTIME_DIR" "$DOCKER_CONFIG"

start_registry

MODEL=$TMP/model
log "generating $SIZE checkpoint in $SHARDS shards"
"$BIN/synth" -q -out "$MODEL" -size "$SIZE" -shards "$SHARDS" -seed 1
MODEL_BYTES=$(du -sb "$MODEL" | cut -f1)
cat "$MODEL"/* >/dev/null

log "pushing with bdnvol and oras"
"$BDNVOL" push "$HOST/bdnvol:v1" "$MODEL" >/dev/null 2>"$TMP/push.err" || { cat "$TMP/push.err" >&2; die "bdnvol push failed"; }
# shellcheck disable=SC2046
(cd "$MODEL" && "$ORAS" push --plain-http --no-tty "$HOST/oras:v1" $(find . -maxdepth 1 -type f -printf '%f\n' | sort) >/dev/null) || die "oras push failed"

LINK_NOTE="loopback"
if [[ ${BENCH_LINK:-0} == 1 ]]; then
	(cd "$ROOT" && go build -o "$BIN/linkproxy" ./bench/linkproxy) || die "building bench/linkproxy failed"
	"$BIN/linkproxy" -target "http://$HOST" -delay "${BENCH_DELAY:-20ms}" -rate "${BENCH_RATE:-50MB}" >"$TMP/linkproxy.addr" 2>"$TMP/linkproxy.log" &
	LINK_PID=$!
	for _ in $(seq 1 100); do [[ -s $TMP/linkproxy.addr ]] && break; sleep 0.1; done
	HOST=$(head -1 "$TMP/linkproxy.addr")
	[[ -n $HOST ]] || die "linkproxy did not start"
	LINK_NOTE="realistic link (bench/linkproxy: ${BENCH_DELAY:-20ms} per request, ${BENCH_RATE:-50MB}/s per request body)"
	log "measuring through the link proxy on $HOST"
fi

# tensor.py MODE DIR: locate (print "file offset length" of the largest
# tensor in the middle half of the last shard) or read (list DIR, read that
# shard's header, then the tensor; print the end time in ns).
cat >"$TMP/tensor.py" <<'EOF'
import json, os, struct, sys, time
mode, d = sys.argv[1], sys.argv[2]
if mode == "read":
    # Started before the mount, so Python's own start-up is not timed:
    # say so, then wait for the go-ahead.
    print("waiting", flush=True)
    sys.stdin.readline()
shards = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
last = os.path.join(d, shards[-1])
with open(last, "rb", buffering=0) as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    ts = sorted((v["data_offsets"] for k, v in hdr.items() if k != "__metadata__"), key=lambda o: o[0])
    mid = ts[len(ts) // 4: 3 * len(ts) // 4] or ts
    b, e = max(mid, key=lambda o: o[1] - o[0])
    off = 8 + n + b
    if mode == "locate":
        print(shards[-1], off, e - b)
        sys.exit(0)
    f.seek(off)
    left = e - b
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            sys.exit("short read")
        left -= len(chunk)
    print(time.time_ns())
EOF
read -r SHARD TOFF TLEN < <(python3 "$TMP/tensor.py" locate "$MODEL")
SHARD_DIGEST=sha256:$(sha256sum "$MODEL/$SHARD" | cut -d' ' -f1)
log "tensor: $SHARD bytes $TOFF+$TLEN"

mountpoint_new() { local mp=$TMP/mnt$1; mkdir -p "$mp"; MOUNTS+=("$mp"); echo "$mp"; }

# 1. first tensor through a fresh mount, vs one range GET, vs oras pull.
MP1=$(mountpoint_new 1)
settle "$MODEL" "$BIN" # no run pays for the previous one's writeback or for reclaim
coproc READER { python3 "$TMP/tensor.py" read "$MP1"; }
read -r _ <&"${READER[0]}" # the reader is up
T0=$(now)
"$BDNVOL" --cache-dir "$TMP/cache1" mount --daemon --prefetch none "$HOST/bdnvol:v1" "$MP1" >/dev/null 2>&1
TREADY=$(now)
echo go >&"${READER[1]}"
read -r T1 <&"${READER[0]}"
wait "$READER_PID" 2>/dev/null || true
FIRST=$(secs "$T0" "$T1")
READY=$(secs "$T0" "$TREADY")
"$BDNVOL" umount "$MP1" >/dev/null 2>&1
# The same with the mount's default --prefetch headers: safetensors headers
# are fetched in the background from the start, as a user's mount does.
MP1H=$(mountpoint_new 1h)
settle "$MODEL" "$BIN"
coproc READER { python3 "$TMP/tensor.py" read "$MP1H"; }
read -r _ <&"${READER[0]}"
T0=$(now)
"$BDNVOL" --cache-dir "$TMP/cache1h" mount --daemon "$HOST/bdnvol:v1" "$MP1H" >/dev/null 2>&1
echo go >&"${READER[1]}"
read -r T1 <&"${READER[0]}"
wait "$READER_PID" 2>/dev/null || true
FIRST_HDR=$(secs "$T0" "$T1")
"$BDNVOL" umount "$MP1H" >/dev/null 2>&1
RANGE_URL="http://$HOST/v2/oras/blobs/$SHARD_DIGEST"
curl -s -o /dev/null -r "$TOFF-$((TOFF + TLEN - 1))" "$RANGE_URL" # warm the connection path
RANGE=$(curl -s -o /dev/null -w '%{time_total}' -r "$TOFF-$((TOFF + TLEN - 1))" "$RANGE_URL")
settle "$MODEL" "$BIN" # no run pays for the previous one's writeback or for reclaim
T0=$(now)
"$ORAS" pull --plain-http --no-tty -o "$TMP/oras-out" "$HOST/oras:v1" >/dev/null
ORAS_PULL=$(secs "$T0" "$(now)")
rm -rf "$TMP/oras-out"
log "first tensor ${FIRST}s (--prefetch headers: ${FIRST_HDR}s), range GET ${RANGE}s, oras pull ${ORAS_PULL}s"

# 2. cold cat through a mount vs bdnvol pull.
settle "$MODEL" "$BIN" # no run pays for the previous one's writeback or for reclaim
T0=$(now)
"$BDNVOL" pull --no-cache "$HOST/bdnvol:v1" "$TMP/pulled" >/dev/null 2>&1
PULL=$(secs "$T0" "$(now)")
rm -rf "$TMP/pulled"
MP2=$(mountpoint_new 2)
"$BDNVOL" --cache-dir "$TMP/cache2" mount --daemon --prefetch none "$HOST/bdnvol:v1" "$MP2" >/dev/null 2>&1
settle "$MODEL" "$BIN" # no run pays for the previous one's writeback or for reclaim
T0=$(now)
find "$MP2" -type f -print0 | xargs -0 cat >/dev/null
COLD=$(secs "$T0" "$(now)")
"$BDNVOL" umount "$MP2" >/dev/null 2>&1
log "bdnvol pull ${PULL}s, cold cat ${COLD}s"

# 3. warm cat (a new mount, chunk cache full) vs the FUSE limit.
MP3=$(mountpoint_new 3)
"$BDNVOL" --cache-dir "$TMP/cache2" mount --daemon --prefetch none "$HOST/bdnvol:v1" "$MP3" >/dev/null 2>&1
sync; sleep 1 # warm: the chunk cache stays in the page cache
T0=$(now)
find "$MP3" -type f -print0 | xargs -0 cat >/dev/null
WARM=$(secs "$T0" "$(now)")
"$BDNVOL" umount "$MP3" >/dev/null 2>&1

# The FUSE limit: one in-memory file, 1 MiB reads, as pkg/lazy mounts.
mkdir -p "$TMP/fuselimit"
cat >"$TMP/fuselimit/main.go" <<'EOF'
// Command fuselimit serves one file of N bytes from memory over FUSE.
package main

import (
	"context"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

var block = make([]byte, 1<<20)

type file struct {
	fs.Inode
	size int64
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size = 0o444, uint64(f.size)
	return 0
}

func (f *file) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (f *file) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n := min(int64(len(dest)), f.size-off, int64(len(block)))
	if n <= 0 {
		return fuse.ReadResultData(nil), 0
	}
	copy(dest, block[:n])
	return fuse.ReadResultData(dest[:n]), 0
}

type root struct {
	fs.Inode
	size int64
}

func (r *root) OnAdd(ctx context.Context) {
	r.AddChild("data", r.NewPersistentInode(ctx, &file{size: r.size}, fs.StableAttr{Mode: syscall.S_IFREG}), false)
}

func main() {
	size, _ := strconv.ParseInt(os.Args[2], 10, 64)
	srv, err := fs.Mount(os.Args[1], &root{size: size}, &fs.Options{MountOptions: fuse.MountOptions{
		MaxReadAhead: 1 << 20, MaxWrite: 1 << 20, Name: "fuselimit", Options: []string{"ro"}}})
	if err != nil {
		panic(err)
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() { <-c; srv.Unmount() }()
	os.Stdout.WriteString("ready\n")
	srv.Wait()
}
EOF
FUSE_MOD=$(cd "$ROOT" && go list -m -f '{{.Path}} {{.Version}}' github.com/hanwen/go-fuse/v2)
printf 'module fuselimit\n\ngo 1.26\n\nrequire %s\n' "$FUSE_MOD" >"$TMP/fuselimit/go.mod"
cp "$ROOT/go.sum" "$TMP/fuselimit/"
(cd "$TMP/fuselimit" && GOFLAGS=-mod=mod go build -o "$BIN/fuselimit" .) >"$TMP/fuselimit.log" 2>&1 || {
	cat "$TMP/fuselimit.log" >&2
	die "building the FUSE-limit file system failed"
}
MP4=$(mountpoint_new 4)
"$BIN/fuselimit" "$MP4" "$MODEL_BYTES" >"$TMP/fuselimit.out" 2>&1 &
FUSE_PID=$!
for _ in $(seq 1 100); do grep -q ready "$TMP/fuselimit.out" 2>/dev/null && break; sleep 0.05; done
settle "$MODEL" "$BIN" # no run pays for the previous one's writeback or for reclaim
T0=$(now)
cat "$MP4/data" >/dev/null
LIMIT=$(secs "$T0" "$(now)")
kill "$FUSE_PID"
wait "$FUSE_PID" 2>/dev/null || true
FUSE_PID=
log "warm cat ${WARM}s, FUSE limit ${LIMIT}s"

# --- report ------------------------------------------------------------------
FAILED=0
mbs() { awk -v b="$MODEL_BYTES" -v s="$1" 'BEGIN {printf "%.0f", b / s / 1e6}'; }
# row METRIC VALUE REFERENCE-NAME REFERENCE RATIO OP LIMIT
row() {
	local ok
	if awk -v r="$5" -v l="$7" -v op="$6" 'BEGIN {exit !(op == "≤" ? r <= l : r >= l)}'; then ok=yes; else
		ok="**no**"
		FAILED=1
	fi
	printf '| %s | %s | %s | %s | %s | %s %s× | %s |\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$ok"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
echo
echo "bdnvol mount, distribution $REGISTRY_VERSION, $LINK_NOTE; $(awk -v b="$MODEL_BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') in $SHARDS shards;"
echo "tensor of $(awk -v b="$TLEN" 'BEGIN {printf "%.1f MiB", b / 1048576}') in $SHARD; $(nproc) CPUs; cold = empty chunk cache."
echo
echo "| metric | bdnvol | reference | reference value | ratio | target | met |"
echo "|---|---|---|---|---|---|---|"
# The targets on loopback, and on the realistic link (BENCH_LINK=1).
FIRST_MAX=2 COLD_MIN=0.7
[[ ${BENCH_LINK:-0} == 1 ]] && FIRST_MAX=1.0 COLD_MIN=1.0
row "mount → tensor in last shard read (s)" "$FIRST" "one range GET of it (s)" "$RANGE" "$(ratio "$FIRST" "$RANGE")" "≤" "$FIRST_MAX"
row "mount (default --prefetch headers) → tensor read (s)" "$FIRST_HDR" "one range GET of it (s)" "$RANGE" "$(ratio "$FIRST_HDR" "$RANGE")" "≤" "$FIRST_MAX"
row "mount → tensor in last shard read (s)" "$FIRST" "oras pull (s)" "$ORAS_PULL" "$(ratio "$FIRST" "$ORAS_PULL")" "≤" 0.05
row "cat through mount, cold (MB/s)" "$(mbs "$COLD")" "bdnvol pull (MB/s)" "$(mbs "$PULL")" "$(ratio "$PULL" "$COLD")" "≥" "$COLD_MIN"
row "cat through mount, warm cache (MB/s)" "$(mbs "$WARM")" "FUSE limit (MB/s)" "$(mbs "$LIMIT")" "$(ratio "$LIMIT" "$WARM")" "≥" 0.7
echo
echo "Ratios: time/time for the first two rows, throughput/throughput for the last two."
echo "Of the first-tensor time, $READY s is \`bdnvol mount --daemon\` until the mount is ready (process start,"
echo "resolve, index, FUSE mount); the rest is ls + header + tensor read, timed by a Python reader started before the mount."
if [[ $FAILED == 1 && ${BENCH_STRICT:-0} == 1 ]]; then
	exit 1
fi
