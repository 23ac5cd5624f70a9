#!/usr/bin/env bash
# bench/warmstate.sh — warm state: what a second replica saves.
#
# Starts a CNCF distribution registry on loopback, pushes a small version,
# and runs the engine stand-in (e2e/cmd/enginestub: vLLM-like cache key and
# layout, a compile that burns CPU for BENCH_COMPILE and writes many small
# files and a few large kernels). Rows, each against the plain path measured
# in the same run:
#   second start: `bdnvol warmstate pull` of the first replica's companion
#     plus the stand-in's load, against the first start's compile (what every
#     replica pays without warm state); wall and client CPU (user+sys);
#   another rank's companion: bytes `warmstate push` uploads for rank 1's
#     cache (its kernels are rank 0's), against the cache's bytes (what a
#     plain copy uploads).
# Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment: BENCH_COMPILE (20s), BENCH_SMALL (300 small files),
# BENCH_LARGE (3 large files), BENCH_LARGE_SIZE (8388608 bytes each),
# BENCH_TOOLS, BENCH_TMPDIR, BENCH_KEEP=1.
set -euo pipefail
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
COMPILE=${BENCH_COMPILE:-20s}
SMALL=${BENCH_SMALL:-300}
LARGE=${BENCH_LARGE:-3}
LARGE_SIZE=${BENCH_LARGE_SIZE:-8388608}
REGISTRY_VERSION=v3.1.2

log() { printf 'bench/warmstate: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

mkdir -p "$BIN"
[[ -x /usr/bin/time ]] && /usr/bin/time -f %U true >/dev/null 2>&1 || die "needs GNU time (/usr/bin/time)"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
REGISTRY=$BIN/registry
log "building bdnvol and enginestub"
(cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol) || die "building bdnvol failed"
(cd "$ROOT/e2e" && go build -o "$BIN/enginestub" ./cmd/enginestub) || die "building enginestub failed"
BDNVOL=$BIN/bdnvol STUB=$BIN/enginestub

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench-warmstate.XXXXXX")
REG_PID=
cleanup() {
	[[ -n $REG_PID ]] && { kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; }
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export XDG_CACHE_HOME=$TMP/xdg XDG_RUNTIME_DIR=$TMP/run DOCKER_CONFIG=$TMP/docker
mkdir -p "$XDG_CACHE_HOME" "$XDG_RUNTIME_DIR" "$DOCKER_CONFIG" "$TMP/weights"
start_registry

head -c 4194304 /dev/urandom >"$TMP/weights/model.safetensors"
VERSION=$("$BDNVOL" push "$HOST/bench/warm:v1" "$TMP/weights" 2>/dev/null | tail -1)
[[ $VERSION == *@sha256:* ]] || die "push of the version failed"
STUBARGS=(-compile-time "$COMPILE" -small-files "$SMALL" -large-files "$LARGE" -large-size "$LARGE_SIZE" -tp 2)

# timed OUT CMD...: runs CMD, its stdout into OUT; sets WALL and CPU (s).
timed() {
	local out=$1
	shift
	local t0 t1
	t0=$(date +%s%N)
	/usr/bin/time -f '%U %S' -o "$TMP/time" "$@" >"$out" 2>"$TMP/err" || { cat "$TMP/err" >&2; die "$* failed"; }
	t1=$(date +%s%N)
	WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", (b-a)/1e9}')
	CPU=$(awk '{printf "%.2f", $1+$2}' "$TMP/time")
}
jget() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

log "first start: compile ($COMPILE)"
timed "$TMP/first.json" "$STUB" -cache-root "$TMP/r0" -rank 0 "${STUBARGS[@]}"
[[ $(jget "$TMP/first.json" mode) == compiled ]] || die "the first start did not compile"
FIRST_WALL=$WALL FIRST_CPU=$CPU
KEY0=$(jget "$TMP/first.json" key)
CACHE_BYTES=$(du -sb "$TMP/r0" | cut -f1)
"$BDNVOL" warmstate push --json --key "$KEY0" "$VERSION" "$TMP/r0" >"$TMP/push0.json" 2>"$TMP/err" || { cat "$TMP/err" >&2; die "warmstate push failed"; }

log "second start: warmstate pull and load"
timed "$TMP/pull.json" "$BDNVOL" warmstate pull --json --key "$KEY0" "$VERSION" "$TMP/r0b"
PULL_WALL=$WALL PULL_CPU=$CPU
timed "$TMP/second.json" "$STUB" -cache-root "$TMP/r0b" -rank 0 "${STUBARGS[@]}"
[[ $(jget "$TMP/second.json" mode) == loaded ]] || die "the second start did not load"
SECOND_WALL=$(awk -v a="$PULL_WALL" -v b="$WALL" 'BEGIN{printf "%.2f", a+b}')
SECOND_CPU=$(awk -v a="$PULL_CPU" -v b="$CPU" 'BEGIN{printf "%.2f", a+b}')

log "rank 1: compile and publish"
"$STUB" -cache-root "$TMP/r1" -rank 1 "${STUBARGS[@]}" >"$TMP/rank1.json"
KEY1=$(jget "$TMP/rank1.json" key)
RANK1_BYTES=$(du -sb "$TMP/r1" | cut -f1)
"$BDNVOL" warmstate push --json --key "$KEY1" "$VERSION" "$TMP/r1" >"$TMP/push1.json" 2>"$TMP/err" || { cat "$TMP/err" >&2; die "warmstate push of rank 1 failed"; }
RANK1_UP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_uploaded"])' "$TMP/push1.json")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.3fx", a/b; else print "-" }'; }
echo "| warm state ($SMALL small files, $LARGE × $LARGE_SIZE B kernels, compile $COMPILE; load: $(cut -d' ' -f1-3 /proc/loadavg)) | bdnvol | plain | ratio |"
echo "|---|---|---|---|"
echo "| second start, wall (s): warmstate pull + load vs compile | $SECOND_WALL | $FIRST_WALL | $(ratio "$SECOND_WALL" "$FIRST_WALL") |"
echo "| second start, client CPU (s) | $SECOND_CPU | $FIRST_CPU | $(ratio "$SECOND_CPU" "$FIRST_CPU") |"
echo "| rank 1's companion uploaded (B) vs its cache | $RANK1_UP | $RANK1_BYTES | $(ratio "$RANK1_UP" "$RANK1_BYTES") |"
echo
echo "First companion: $(jget "$TMP/push0.json" bytes_uploaded) B uploaded for a $CACHE_BYTES B cache."
