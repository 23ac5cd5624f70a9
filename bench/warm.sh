#!/usr/bin/env bash
# bench/warm.sh — warm reads through a bdnvol mount against local files.
#
# Starts a CNCF distribution registry on loopback, pushes a synthetic
# safetensors checkpoint, fills a chunk cache with `bdnvol cache warm` (which
# makes the passthrough backing files too), then mounts the version over that
# cache and compares three readers on the mount with the same readers on the
# checkpoint's local copy, on the same disk (with the page cache dropped, on
# a new mount each run: every read is a first open after the mount):
#   seq:  cat of every file in turn;
#   par4: the four largest files read at once (one cat each);
#   mmap: bench/loader -mode mmap (every tensor of every shard touched
#         through a shared mapping, in header order).
# Each reader runs with the page cache dropped before each run (as root)
# and with everything already in the page cache (one untimed pass, then the
# median of BENCH_HOT hot passes, local and mount alternating). Each row is
# measured BENCH_RUNS times; the table gives the median ratio and the range.
# Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment: BENCH_SIZE (2GiB), BENCH_SHARDS (4), BENCH_RUNS (3),
# BENCH_HOT (10), BENCH_TOOLS, BENCH_TMPDIR, BENCH_KEEP=1, BENCH_STRICT=1
# (exit 1 when a target is missed), BENCH_MOUNT_ARGS (extra arguments to
# `bdnvol mount`, e.g. --no-passthrough), as in bench/mount.sh.
set -euo pipefail
shopt -s inherit_errexit # a reader failing inside $(...) fails the bench

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
SIZE=${BENCH_SIZE:-2GiB}
SHARDS=${BENCH_SHARDS:-4}
RUNS=${BENCH_RUNS:-3}
HOT=${BENCH_HOT:-10}
REGISTRY_VERSION=v3.1.2

log() { printf 'bench/warm: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s%N; }

mkdir -p "$BIN"
command -v fusermount3 >/dev/null || [[ $(id -u) == 0 ]] || die "needs fusermount3 (apt-get install fuse3) or root"
[[ -e /dev/fuse ]] || die "no /dev/fuse"
DROP=1
[[ -w /proc/sys/vm/drop_caches ]] || { DROP=0; log "not root: the page-cache-dropped rows are skipped"; }
TIMEV=
[[ -x /usr/bin/time ]] && /usr/bin/time -f %R true >/dev/null 2>&1 && TIMEV=/usr/bin/time

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
REGISTRY=$BIN/registry
log "building synth, bdnvol and loader"
(cd "$ROOT/e2e" && go build -o "$BIN/synth" ./cmd/synth) || die "building e2e/cmd/synth failed"
(cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol && go build -o "$BIN/loader" ./bench/loader) || die "building failed"
BDNVOL=$BIN/bdnvol LOADER=$BIN/loader

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench-warm.XXXXXX")
REG_PID=
MOUNTS=()
cleanup() {
	local mp
	for mp in "${MOUNTS[@]}"; do
		if grep -qF " $mp " /proc/self/mountinfo; then
			"$BDNVOL" umount "$mp" >/dev/null 2>&1 || fusermount3 -u -z "$mp" 2>/dev/null || true
		fi
	done
	[[ -n $REG_PID ]] && { kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; }
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
"$BDNVOL" push "$HOST/bdnvol:v1" "$MODEL" >/dev/null 2>"$TMP/push.err" || { cat "$TMP/push.err" >&2; die "push failed"; }
NFILES=$(find "$MODEL" -type f -size +0 | wc -l)

# mountpoint_new NAME: make $TMP/mntNAME, to be unmounted on exit, in $MP.
mountpoint_new() { MP=$TMP/mnt$1; mkdir -p "$MP"; MOUNTS+=("$MP"); }
CACHE=$TMP/cache
# shellcheck disable=SC2086
mount_warm() { "$BDNVOL" --cache-dir "$CACHE" mount --daemon --prefetch none ${BENCH_MOUNT_ARGS:-} "$HOST/bdnvol:v1" "$1" >/dev/null; }

# Fill the cache as a node is warmed: `bdnvol cache warm` fetches every
# chunk and makes each large file's backing file (folding the file's chunks
# into it), so that no open of the mounts below copies anything.
log "warming the chunk cache (bdnvol cache warm)"
WT0=$(now)
if [[ -n $TIMEV ]]; then
	$TIMEV -f '%U %S' -o "$TMP/warm.time" "$BDNVOL" --cache-dir "$CACHE" cache warm "$HOST/bdnvol:v1" >/dev/null 2>"$TMP/warm.err" || { cat "$TMP/warm.err" >&2; die "cache warm failed"; }
	WARM_CPU=$(awk '{printf "%.2f", $1 + $2}' "$TMP/warm.time")
else
	"$BDNVOL" --cache-dir "$CACHE" cache warm "$HOST/bdnvol:v1" >/dev/null 2>"$TMP/warm.err" || { cat "$TMP/warm.err" >&2; die "cache warm failed"; }
	WARM_CPU=n/a
fi
WARM_WALL=$(awk -v a="$WT0" -v b="$(now)" 'BEGIN {printf "%.2f", (b - a) / 1e9}')
BACKINGS=$(find "$CACHE/chunks/files" -type f 2>/dev/null | wc -l)
log "$BACKINGS backing files for $NFILES non-empty files"
# Disk the warm cache takes (allocated blocks: chunks, backing files,
# folded entries) beyond the checkpoint's own size.
CACHE_DISK=$(du -s -B1 "$CACHE/chunks/sha256" "$CACHE/chunks/files" "$CACHE/chunks/in" 2>/dev/null | awk '{n += $1} END {print n + 0}')
MODEL_DISK=$(du -s -B1 "$MODEL" | cut -f1)
EXTRA=$(awk -v c="$CACHE_DISK" -v m="$MODEL_DISK" 'BEGIN {printf "%.3f", (c - m) / m}')
log "cache takes $CACHE_DISK bytes of disk for a checkpoint of $MODEL_DISK: $EXTRA extra"

mountpoint_new warm
MNT=$MP
mount_warm "$MNT"
# The mount's files are what the reference reads, in the same order.
diff <(cd "$MODEL" && find . -type f | sort) <(cd "$MNT" && find . -type f | sort) >/dev/null || die "the mount does not list the checkpoint's files"
# The backing files' pages are still those the assembly wrote: one mmap
# load now, against one of the local files, both in the page cache.
FRESH=
if [[ -n $TIMEV ]]; then
	"$LOADER" -mode mmap "$MODEL" >/dev/null
	FRESH_LOCAL=$($TIMEV -f '%e s, %R faults' "$LOADER" -mode mmap "$MODEL" 2>&1 >/dev/null | tail -1)
	FRESH_MOUNT=$($TIMEV -f '%e s, %R faults' "$LOADER" -mode mmap "$MNT" 2>&1 >/dev/null | tail -1)
	FRESH="mmap load right after the backing files were made (their pages as written): $FRESH_MOUNT through the mount, $FRESH_LOCAL on local files (cached)."
fi
(cd "$MODEL" && find . -type f -print0 | xargs -0 -I{} cmp {} "$MNT/{}") || die "the mount's bytes differ from the checkpoint's"
# fuse_reads: the FUSE READ requests the mount served for all its files
# (the root's count: a file's own count restarts when the kernel forgets
# its inode, as dropping the page caches makes it do); fails when the mount
# is gone.
fuse_reads() { python3 -c 'import os, sys; print(int(os.getxattr(sys.argv[1], "user.bdnvol.fuse-reads")))' "$MNT"; }
# The count when the current mount was made is kept in $TMP/reads0, not a
# variable: remount runs inside measure's command substitution, a subshell.
fuse_reads >"$TMP/reads0" || die "the mount is gone"
echo 0 >"$TMP/reads"
# remount: a new mount of the warm cache, so that the next read is each
# file's first open after a mount; the FUSE READs of the old one are added
# to $TMP/reads.
remount() {
	local n
	n=$(fuse_reads) || die "the mount is gone"
	echo $(($(cat "$TMP/reads") + n - $(cat "$TMP/reads0"))) >"$TMP/reads"
	"$BDNVOL" umount "$MNT" >/dev/null || die "umount failed"
	mount_warm "$MNT"
	fuse_reads >"$TMP/reads0" || die "the mount is gone"
}

# Readers: each takes a directory and reads it all.
read_seq() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 cat >/dev/null); }
read_par4() { (cd "$1" && find . -type f -printf '%s %p\0' | sort -z -rn | head -z -n 4 | cut -z -d' ' -f2- | xargs -0 -n 1 -P 4 cat >/dev/null); }
read_mmap() { "$LOADER" -mode mmap "$1" >/dev/null; }

drop() { sync; echo 1 >/proc/sys/vm/drop_caches; sleep 0.5; }
# timed READER DIR: run it, print seconds.
timed() {
	local t0
	t0=$(now)
	"read_$1" "$2"
	awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.4f\n", (b - a) / 1e9}'
}
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# faults READER DIR: minor+major page faults of one run (mmap reader).
faults() { $TIMEV -f '%R %F' "$LOADER" -mode mmap "$2" 2>&1 >/dev/null | tail -1 | awk '{printf "%d minor + %d major", $1, $2}'; }

# measure MODE READER: one run of a row; prints "local mount".
measure() {
	local mode=$1 r=$2 l m ls ms
	if [[ $mode == dropped ]]; then
		drop
		l=$(timed "$r" "$MODEL")
		remount
		drop
		m=$(timed "$r" "$MNT")
	else
		read_"$r" "$MODEL"
		read_"$r" "$MNT"
		ls=() ms=()
		for _ in $(seq 1 "$HOT"); do
			ls+=("$(timed "$r" "$MODEL")")
			ms+=("$(timed "$r" "$MNT")")
		done
		l=$(printf '%s\n' "${ls[@]}" | median)
		m=$(printf '%s\n' "${ms[@]}" | median)
	fi
	echo "$l $m"
}

FAILED=0
ROWS=()
for mode in dropped cached; do
	[[ $mode == dropped && $DROP == 0 ]] && continue
	for r in seq par4 mmap; do
		res=()
		for i in $(seq 1 "$RUNS"); do
			out=$(measure "$mode" "$r") || die "$mode $r: a reader failed"
			read -r l m <<<"$out"
			res+=("$l $m")
			log "$mode $r run $i: local ${l}s, mount ${m}s ($(awk -v a="$m" -v b="$l" 'BEGIN {printf "%.2f", a / b}')x)"
		done
		ROWS+=("$mode $r $(printf '%s\n' "${res[@]}" | awk '{r = $2 / $1; print $1, $2, r}' | sort -k3 -g | awk '
			{l[NR] = $1; m[NR] = $2; r[NR] = $3}
			END {k = int((NR + 1) / 2); printf "%s %s %.2f %.2f %.2f", l[k], m[k], r[k], r[1], r[NR]}')")
	done
done
MF_LOCAL= MF_MOUNT= DF_LOCAL= DF_MOUNT=
if [[ -n $TIMEV ]]; then
	read_mmap "$MODEL" && read_mmap "$MNT"
	MF_LOCAL=$(faults mmap "$MODEL") MF_MOUNT=$(faults mmap "$MNT")
	if [[ $DROP == 1 ]]; then
		drop
		DF_LOCAL=$(faults mmap "$MODEL")
		drop
		DF_MOUNT=$(faults mmap "$MNT")
	fi
fi
READS1=$(fuse_reads) || die "the mount is gone after the runs"
FUSE_READS=$(($(cat "$TMP/reads") + READS1 - $(cat "$TMP/reads0")))

# --- report ------------------------------------------------------------------
name() {
	case $1 in
	seq) echo "sequential cat" ;;
	par4) echo "4 files in parallel" ;;
	mmap) echo "mmap loader" ;;
	esac
}
echo
echo "bdnvol warm mount, $(awk -v b="$MODEL_BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') in $SHARDS shards, $(nproc) CPUs;"
echo "chunk cache filled by \`bdnvol cache warm\` (${WARM_WALL} s, ${WARM_CPU} s user+sys), $BACKINGS backing files for $NFILES files; ${BENCH_MOUNT_ARGS:-default mount options}."
echo "Medians of $RUNS runs; cached rows: median of $HOT hot passes each run. Page-caches-dropped rows: a new mount before each run, so every read is the file's first open after a mount."
echo
echo "| reader | page cache | local (s) | mount (s) | ratio mount/local | range ($RUNS runs) | target | met |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${ROWS[@]}"; do
	read -r mode r l m ratio lo hi <<<"$row"
	ok=yes
	awk -v x="$ratio" 'BEGIN {exit !(x <= 1.1)}' || { ok="**no**"; FAILED=1; }
	printf '| %s | %s | %s | %s | %s | %s–%s | ≤ 1.1× | %s |\n' "$(name "$r")" "$mode" "$l" "$m" "$ratio" "$lo" "$hi" "$ok"
done
echo
if [[ -n $MF_LOCAL ]]; then
	echo "Page faults of one mmap load, all cached: $MF_LOCAL on local files, $MF_MOUNT through the mount."
	[[ -n $DF_LOCAL ]] && echo "Page caches dropped: $DF_LOCAL on local files, $DF_MOUNT through the mount."
	echo "The first $FRESH"
fi
echo "FUSE READ requests the warm mounts served during the timed runs: $FUSE_READS."
echo
ok=yes
awk -v x="$EXTRA" 'BEGIN {exit !(x <= 0.05)}' || { ok="**no**"; FAILED=1; }
echo "| measure | warm cache | checkpoint on disk | ratio | target | met |"
echo "|---|---|---|---|---|---|"
printf '| extra disk a warm version takes beyond its size (%s) | %s B | %s B | %s | ≤ 0.05× | %s |\n' "$(df -PT "$CACHE" | awk 'NR == 2 {print $2}')" "$CACHE_DISK" "$MODEL_DISK" "$EXTRA" "$ok"
if [[ $FAILED == 1 && ${BENCH_STRICT:-0} == 1 ]]; then
	exit 1
fi
