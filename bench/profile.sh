#!/usr/bin/env bash
# bench/profile.sh — cold starts on the emulated link, with and without a
# startup profile (docs/mount.md#startup-profiles).
#
# Starts a CNCF distribution registry on loopback behind bench/linkproxy
# (BENCH_DELAY, default 20ms per request; BENCH_RATE, default 50MB/s per
# request body), pushes a synthetic safetensors checkpoint, records its
# startup profile once with `bdnvol profile record --push` running
# bench/loader, and measures, each on an empty chunk cache:
#   pull then load: `bdnvol pull --no-cache`, then bench/loader on the copy;
#   mount then load: `bdnvol mount --daemon` to the loader's last tensor,
#     with --profile off and with the profile (found as a referrer), with
#     the loader reading (read) and mapping (mmap) the tensors;
#   cat through a cold mount (no profile, --prefetch none) against pull;
#   the first mid-shard tensor through a fresh mount (default --prefetch
#     headers, no profile), 5 runs, against one range GET of its bytes.
# Client CPU (user+sys) is the bdnvol process's: pull's, or the mount
# daemon's. Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment: BENCH_SIZE (1GiB), BENCH_SHARDS (4), BENCH_PAUSE (loader
# pause per tensor, 0), BENCH_TOOLS, BENCH_TMPDIR, BENCH_KEEP=1, as in
# bench/mount.sh. A kept directory holds the linkproxy's request log,
# mounts.log, and each load's per-tensor reads (trace-local, traceN:
# bench/loader -trace), for bench/replay_start.py and bench/waits.py.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
SIZE=${BENCH_SIZE:-1GiB}
SHARDS=${BENCH_SHARDS:-4}
PAUSE=${BENCH_PAUSE:-0}
REGISTRY_VERSION=v3.1.2

log() { printf 'bench/profile: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b - a) / 1e9}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

mkdir -p "$BIN"
command -v fusermount3 >/dev/null || [[ $(id -u) == 0 ]] || die "needs fusermount3 (apt-get install fuse3) or root"
command -v curl >/dev/null || die "needs curl"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
REGISTRY=$BIN/registry
log "building synth, bdnvol, loader and linkproxy"
(cd "$ROOT/e2e" && go build -o "$BIN/synth" ./cmd/synth) || die "building e2e/cmd/synth failed"
(cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol && go build -o "$BIN/loader" ./bench/loader &&
	go build -o "$BIN/linkproxy" ./bench/linkproxy) || die "building failed"
BDNVOL=$BIN/bdnvol LOADER=$BIN/loader

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench-profile.XXXXXX")
REG_PID= LINK_PID=
MOUNTS=()
cleanup() {
	local mp
	for mp in "${MOUNTS[@]}"; do
		mountpoint -q "$mp" 2>/dev/null && { "$BDNVOL" umount "$mp" >/dev/null 2>&1 || fusermount3 -u -z "$mp" 2>/dev/null || true; }
	done
	[[ -n $LINK_PID ]] && { kill "$LINK_PID" 2>/dev/null || true; wait "$LINK_PID" 2>/dev/null || true; }
	[[ -n $REG_PID ]] && { kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; }
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export XDG_CACHE_HOME=$TMP/xdg XDG_RUNTIME_DIR=$TMP/run DOCKER_CONFIG=$TMP/docker
mkdir -p "$XDG_CACHE_HOME" "$XDG_RUNTIME_DIR" "$DOCKER_CONFIG"
start_registry
DIRECT=$HOST

MODEL=$TMP/model
log "generating $SIZE checkpoint in $SHARDS shards"
"$BIN/synth" -q -out "$MODEL" -size "$SIZE" -shards "$SHARDS" -seed 1
MODEL_BYTES=$(du -sb "$MODEL" | cut -f1)
"$BDNVOL" push "$DIRECT/bdnvol:v1" "$MODEL" >/dev/null 2>"$TMP/push.err" || { cat "$TMP/push.err" >&2; die "push failed"; }

# The last shard as one blob, for the range GET reference.
SHARD=$(cd "$MODEL" && ls ./*.safetensors | sort | tail -1)
SHARD=${SHARD#./}
SHARD_DIGEST=sha256:$(sha256sum "$MODEL/$SHARD" | cut -d' ' -f1)
LOC=$(curl -s -D - -o /dev/null -X POST "http://$DIRECT/v2/raw/blobs/uploads/" | tr -d '\r' | awk 'tolower($1) == "location:" {print $2}')
[[ $LOC == http* ]] || LOC=http://$DIRECT$LOC
curl -sf -X PUT -H 'Content-Type: application/octet-stream' --data-binary "@$MODEL/$SHARD" "$LOC&digest=$SHARD_DIGEST" >/dev/null ||
	die "uploading the shard blob failed"
# The largest tensor in the middle half of the last shard: "header-length offset length".
read -r HLEN TOFF TLEN < <(mid_tensor "$MODEL/$SHARD")

"$BIN/linkproxy" -log "$TMP/requests.log" -target "http://$DIRECT" -delay "${BENCH_DELAY:-20ms}" -rate "${BENCH_RATE:-50MB}" >"$TMP/linkproxy.addr" 2>"$TMP/linkproxy.log" &
LINK_PID=$!
for _ in $(seq 1 100); do [[ -s $TMP/linkproxy.addr ]] && break; sleep 0.1; done
HOST=$(head -1 "$TMP/linkproxy.addr")
[[ -n $HOST ]] || die "linkproxy did not start"
REF=$HOST/bdnvol:v1

log "recording the profile (loader through a mount, via the link)"
"$BDNVOL" --cache-dir "$TMP/crec" profile record --quiet 3s --push -o "$TMP/profile.json" "$REF" -- \
	sh -c "exec '$LOADER' \"\$BDNVOL_MOUNT\"" >/dev/null 2>"$TMP/record.err" || { cat "$TMP/record.err" >&2; die "profile record failed"; }
PROFILE_CHUNKS=$(grep -c '"sha256:' "$TMP/profile.json")

# cpu PID: user+sys seconds of a live process.
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / t}' "/proc/$1/stat"; }
# timed_cpu CMD...: run CMD; set WALL and CPU (its user+sys).
timed_cpu() {
	local t0
	t0=$(now)
	/usr/bin/time -f '%U %S' -o "$TMP/time.out" "$@" >/dev/null 2>"$TMP/cmd.err" || { cat "$TMP/cmd.err" >&2; die "$* failed"; }
	WALL=$(secs "$t0" "$(now)")
	CPU=$(awk '{printf "%.2f", $1 + $2}' "$TMP/time.out")
}
N=0
# daemon_pid: the pid `mount --daemon` reported on stderr ($TMP/mount.err).
# (Not pgrep: reading other processes' command lines can hang on a machine
# with a stuck FUSE mount.)
# runq_wait PID: milliseconds the process's threads spent runnable but not
# running (waiting for a CPU), summed: what a loaded machine adds.
runq_wait() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{w += $2} END {printf "%.0f", w / 1e6}'; }
daemon_pid() { sed -n 's/.*(pid \([0-9]*\),.*/\1/p' "$TMP/mount.err" | tail -1; }
# start_load CACHE-SUFFIX MOUNT-FLAGS...: mount on a fresh cache, run the
# loader (LOADER_MODE), unmount; set WALL (mount start to last tensor)
# and CPU (the daemon's).
mount_load() {
	N=$((N + 1))
	local mp=$TMP/mnt$N t0 pid
	mkdir -p "$mp"
	MOUNTS+=("$mp")
	settle "$MODEL" "$BIN"
	t0=$(now)
	"$BDNVOL" --cache-dir "$TMP/cache$N" mount --daemon "$@" "$REF" "$mp" >/dev/null 2>"$TMP/mount.err" || { cat "$TMP/mount.err" >&2; die "mount failed"; }
	# When the mount started and was ready (ns since the epoch, as the
	# linkproxy -log's seconds), for reading the request log.
	echo "$N $LOADER_MODE $t0 $(now) $*" >>"$TMP/mounts.log"
	"$LOADER" -mode "$LOADER_MODE" -pause "$PAUSE" -trace "$TMP/trace$N" "$mp" >"$TMP/load$N.json" || die "loader failed"
	WALL=$(secs "$t0" "$(now)")
	CPU=$(cpu "$(daemon_pid)")
	RUNQ="$(runq_wait "$(daemon_pid)") ms daemon, $(sed -n 's/.*"runq_ms":\([0-9]*\).*/\1/p' "$TMP/load$N.json") ms loader"
	"$BDNVOL" umount "$mp" >/dev/null 2>&1
}

log "pull, then load"
settle "$MODEL" "$BIN"
echo "pull pull $(now) $(now) --no-cache" >>"$TMP/mounts.log"
timed_cpu "$BDNVOL" pull --no-cache "$REF" "$TMP/pulled"
PULL=$WALL PULL_CPU=$CPU
LOADER_MODE=read
timed_cpu "$LOADER" -pause "$PAUSE" -trace "$TMP/trace-local" "$TMP/pulled"
LOAD_LOCAL=$WALL
PULL_LOAD=$(awk -v a="$PULL" -v b="$LOAD_LOCAL" 'BEGIN {printf "%.3f", a + b}')
rm -rf "$TMP/pulled"

declare -A T C Q
for LOADER_MODE in read mmap; do
	log "mount then load ($LOADER_MODE): no profile, profile"
	mount_load --profile off
	T[off-$LOADER_MODE]=$WALL C[off-$LOADER_MODE]=$CPU Q[off-$LOADER_MODE]=$RUNQ
	mount_load
	T[on-$LOADER_MODE]=$WALL C[on-$LOADER_MODE]=$CPU Q[on-$LOADER_MODE]=$RUNQ
done

log "cat through a cold mount"
N=$((N + 1))
MP=$TMP/mnt$N
mkdir -p "$MP"
MOUNTS+=("$MP")
"$BDNVOL" --cache-dir "$TMP/cache$N" mount --daemon --prefetch none --profile off "$REF" "$MP" >/dev/null 2>"$TMP/mount.err"
settle "$MODEL" "$BIN"
T0=$(now)
echo "$N cat $T0 $T0 --prefetch none --profile off" >>"$TMP/mounts.log"
find "$MP" -type f -print0 | xargs -0 cat >/dev/null
COLD=$(secs "$T0" "$(now)")
COLD_CPU=$(cpu "$(daemon_pid)")
"$BDNVOL" umount "$MP" >/dev/null 2>&1

log "first mid-shard tensor, 5 runs"
RANGE_URL="http://$HOST/v2/raw/blobs/$SHARD_DIGEST"
FIRSTS=() RANGES=() SPLITS=() WAITS=()
for _ in 1 2 3 4 5; do
	N=$((N + 1))
	MP=$TMP/mnt$N
	mkdir -p "$MP"
	MOUNTS+=("$MP")
	settle "$MODEL" "$BIN"
	T0=$(now)
	echo "=== first tensor run $N" >>"$TMP/requests.log"
	"$BDNVOL" --cache-dir "$TMP/cache$N" mount --daemon --profile off "$REF" "$MP" >/dev/null 2>"$TMP/mount.err"
	T1=$(now)
	echo "$N first $T0 $T1 --profile off" >>"$TMP/mounts.log"
	dd if="$MP/$SHARD" of=/dev/null bs=1M iflag=count_bytes count="$HLEN" status=none
	T2=$(now)
	dd if="$MP/$SHARD" of=/dev/null bs=1M iflag=skip_bytes,count_bytes skip="$TOFF" count="$TLEN" status=none
	T3=$(now)
	FIRSTS+=("$(secs "$T0" "$T3")")
	SPLITS+=("$(secs "$T0" "$T1") + $(secs "$T1" "$T2") + $(secs "$T2" "$T3")")
	WAITS+=("$(runq_wait "$(daemon_pid)")")
	"$BDNVOL" umount "$MP" >/dev/null 2>&1
	RANGES+=("$(curl -s -o /dev/null -w '%{time_total}' -r "$TOFF-$((TOFF + TLEN - 1))" "$RANGE_URL")")
done

# --- report ------------------------------------------------------------------
echo
echo "bdnvol startup profiles, distribution $REGISTRY_VERSION behind bench/linkproxy (${BENCH_DELAY:-20ms} per request,"
echo "${BENCH_RATE:-50MB}/s per request body); $(awk -v b="$MODEL_BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') in $SHARDS shards; profile of $PROFILE_CHUNKS chunks;"
echo "loader pause per tensor $PAUSE; $(nproc) CPUs; every run on an empty chunk cache. CPU: the bdnvol process (user+sys s)."
echo
echo "| measure | bdnvol (s) | CPU | reference | reference (s) | ratio |"
echo "|---|---|---|---|---|---|"
echo "| pull alone | $PULL | $PULL_CPU | | | |"
echo "| pull then load (read) | $PULL_LOAD | $PULL_CPU | | | |"
for m in read mmap; do
	echo "| mount, no profile, then load ($m) | ${T[off-$m]} | ${C[off-$m]} | pull then load | $PULL_LOAD | $(ratio "${T[off-$m]}" "$PULL_LOAD")x |"
	echo "| mount with profile, then load ($m) | ${T[on-$m]} | ${C[on-$m]} | pull then load | $PULL_LOAD | $(ratio "${T[on-$m]}" "$PULL_LOAD")x |"
	echo "| mount with profile, then load ($m) | ${T[on-$m]} | ${C[on-$m]} | pull alone | $PULL | $(ratio "${T[on-$m]}" "$PULL")x |"
done
echo "| cat through a cold mount (no profile) | $COLD | $COLD_CPU | pull alone | $PULL | $(ratio "$COLD" "$PULL")x |"
for i in 0 1 2 3 4; do
	echo "| first mid-shard tensor, fresh mount (run $((i + 1))) | ${FIRSTS[$i]} | | one range GET | ${RANGES[$i]} | $(ratio "${FIRSTS[$i]}" "${RANGES[$i]}")x |"
done
echo
echo "First-tensor runs, mount + header + tensor (s), and the mount daemon's run-queue wait (ms, all threads):"
for i in 0 1 2 3 4; do
	echo "run $((i + 1)): ${SPLITS[$i]}; ${WAITS[$i]} ms"
done
echo
echo "Loading the pulled copy alone took ${LOAD_LOCAL}s (page cache warm from the pull)."
echo
echo "Run-queue wait during each mount's load (runnable, not running; all threads):"
for m in read mmap; do
	echo "- $m: no profile ${Q[off-$m]}; profile ${Q[on-$m]}"
done
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
if [[ ${BENCH_KEEP:-0} == 1 ]]; then
	echo "Request timeline (linkproxy -log): $TMP/requests.log; when each mount started: $TMP/mounts.log."
	echo "The replay's start: \`python3 bench/replay_start.py $TMP\`."
fi
