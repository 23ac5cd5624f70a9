#!/usr/bin/env bash
# bench/dataset.sh — bdnvol on dataset-shaped volumes: many small
# files in a hundred directories, against a CNCF distribution registry on
# loopback. For each file count it generates the tree in a temp dir (deleted
# afterwards) and measures:
#   push files/s against `tar -c | sha256sum` of the same tree, pull time and
#   client CPU against `cp -r`, peak open files of the pull, bytes uploaded
#   for a one-file change, peak RSS of pull, mount, versions, inspect and
#   diff, and `ls -R` of a mount against `ls -R` of the pulled tree; push
#   time against tar's, a re-push after a one-file change against the first
#   push, a re-pull of that version into the directory holding the first
#   (peak RSS), and an upgrade with one directory in a hundred rewritten
#   (bytes fetched against the bytes changed).
# Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment:
#   BENCH_DATASET_FILES  file counts, space-separated (default "100000 1000000";
#                        e.g. BENCH_DATASET_FILES=100000 for the smaller run alone)
#   BENCH_DATASET_DIRS   directories (default 100)
#   BENCH_DATASET_SIZE   bytes per file (default 1024)
#   BENCH_TOOLS, BENCH_TMPDIR, BENCH_KEEP=1, BENCH_JOBS, BENCH_STRICT=1,
#   BENCH_TIME, BENCH_DROP_CACHES as for bench.sh.
# The mount rows need /dev/fuse with fusermount3 or root; without, they are
# left out.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
COUNTS=${BENCH_DATASET_FILES:-100000 1000000}
DIRS=${BENCH_DATASET_DIRS:-100}
FSIZE=${BENCH_DATASET_SIZE:-1024}
REGISTRY_VERSION=v3.1.2

log() { printf 'dataset: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

mkdir -p "$BIN"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
REGISTRY=$BIN/registry
log "building bdnvol and datagen"
(cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol && go build -o "$BIN/datagen" ./bench/datagen) || die "build failed"
BDNVOL=$BIN/bdnvol
TIME_BIN=${BENCH_TIME:-/usr/bin/time}
[[ -x $TIME_BIN ]] || die "GNU time is needed at $TIME_BIN (apt-get install time)"

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-dataset.XXXXXX")
REG_PID=
MNT=
cleanup() {
	if [[ -n $MNT ]]; then
		"$BDNVOL" umount "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT" 2>/dev/null || true
	fi
	if [[ -n $REG_PID ]]; then
		kill "$REG_PID" 2>/dev/null || true
		wait "$REG_PID" 2>/dev/null || true
	fi
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
start_registry
export DOCKER_CONFIG=$TMP/docker
mkdir -p "$DOCKER_CONFIG"
JOBS=()
[[ -n ${BENCH_JOBS:-} ]] && JOBS=(--jobs "$BENCH_JOBS")

declare -A WALL CPU RSS

# timed NAME CMD...: runs CMD under GNU time (stdout to $TMP/NAME.out) and
# records wall seconds, user+system seconds and peak RSS (KiB).
timed() {
	local name=$1
	shift
	log "running $name"
	"$TIME_BIN" -v -o "$TMP/$name.time" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || {
		cat "$TMP/$name.err" >&2
		die "$name failed: $*"
	}
	read_time "$name"
}
read_time() {
	local name=$1
	WALL[$name]=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, a, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + a[i]; printf "%.2f", s}' "$TMP/$name.time")
	CPU[$name]=$(awk -F': ' '/User time \(seconds\)/ {u = $2} /System time \(seconds\)/ {s = $2} END {printf "%.2f", u + s}' "$TMP/$name.time")
	RSS[$name]=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$TMP/$name.time")
}

# peak_fds PID: polls the open descriptors of PID (and its children) until
# it exits; prints the most seen.
peak_fds() {
	local pid=$1 most=0 n p
	while kill -0 "$pid" 2>/dev/null; do
		for p in $(pgrep -P "$pid" 2>/dev/null) "$pid"; do
			n=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
			((n > most)) && most=$n
		done
		sleep 0.02
	done
	echo "$most"
}

rssmib() { awk -v k="$1" 'BEGIN {printf "%.0f", k / 1024}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
FAILED=0
# check VALUE LIMIT: "yes" when VALUE <= LIMIT, else "**no**" (and FAILED).
check() {
	if awk -v v="$1" -v l="$2" 'BEGIN {exit !(v != "n/a" && v <= l)}'; then echo yes; else
		FAILED=1
		echo "**no**"
	fi
}

ROWS=()
have_fuse() { [[ -e /dev/fuse ]] && { [[ $(id -u) == 0 ]] || command -v fusermount3 >/dev/null; }; }

for N in $COUNTS; do
	D=$TMP/n$N
	mkdir -p "$D"
	export XDG_CACHE_HOME=$D/cache
	need=$((N * (FSIZE + 4096) * 3 / 1024)) # KiB: tree, pulled tree, copy
	avail=$(df -Pk "$D" | awk 'NR == 2 {print $4}')
	if ((avail < need)); then
		log "skipping $N files: $((need / 1024)) MiB needed, $((avail / 1024)) MiB free"
		continue
	fi
	log "generating $N files of $FSIZE bytes in $DIRS directories"
	"$BIN/datagen" -out "$D/src" -files "$N" -dirs "$DIRS" -size "$FSIZE"
	REPO=$HOST/data$N

	settle "$D/src"
	timed tar$N sh -c "tar -c -C '$D/src' . | sha256sum"
	settle "$D/src"
	timed push$N "$BDNVOL" push --json "${JOBS[@]}" "$REPO:v1" "$D/src"

	# Pull, with its open descriptors polled, against cp -r.
	settle
	log "running pull$N"
	"$TIME_BIN" -v -o "$TMP/pull$N.time" "$BDNVOL" pull --json "${JOBS[@]}" "$REPO:v1" "$D/pulled" >"$TMP/pull$N.out" 2>"$TMP/pull$N.err" &
	tpid=$!
	FDS=$(peak_fds "$tpid")
	wait "$tpid" || { cat "$TMP/pull$N.err" >&2; die "pull of $N files failed"; }
	read_time pull$N
	settle "$D/src"
	timed cp$N cp -r "$D/src" "$D/copy"
	diff -r -q "$D/src" "$D/pulled" >/dev/null || die "the pulled tree of $N files differs from the source"
	rm -rf "$D/copy"
	# The same pull under a limit of 256 open files, settled as the first
	# (cp -r and diff -r have just filled the page cache).
	log "pull under ulimit -n 256"
	settle
	if "$TIME_BIN" -v -o "$TMP/limited$N.time" sh -c "ulimit -n 256 && exec '$BDNVOL' pull --json ${JOBS[*]} '$REPO:v1' '$D/limited'" >/dev/null 2>"$TMP/limited$N.err"; then
		LIMITED=yes
		read_time limited$N
	else
		LIMITED="**no**"
		FAILED=1
		cat "$TMP/limited$N.err" >&2
	fi
	rm -rf "$D/limited"

	# One file changed by one byte, pushed again.
	f=$(find "$D/src" -type f -name '*.bin' | sort | sed -n "$((N / 2))p")
	printf 'x' | dd of="$f" bs=1 seek=7 conv=notrunc status=none
	timed push2_$N "$BDNVOL" push --json "${JOBS[@]}" "$REPO:v2" "$D/src"
	UP=$(grep -o '"bytes_uploaded":[0-9]*' "$TMP/push2_$N.out" | tail -1 | cut -d: -f2)
	REUSED=$(grep -o '"pieces_reused":[0-9]*' "$TMP/push2_$N.out" | tail -1 | cut -d: -f2)
	BUILT=$(grep -o '"pieces_built":[0-9]*' "$TMP/push2_$N.out" | tail -1 | cut -d: -f2)

	# Re-pull: v2 into the directory that holds v1 (and the stat records
	# of v1's pull).
	settle
	timed repull$N "$BDNVOL" pull --json "${JOBS[@]}" "$REPO:v2" "$D/pulled"
	# Upgrade: the files of one directory of the hundred (1 % of them)
	# rewritten, pushed as v3 and pulled into the directory holding v2.
	"$BIN/datagen" -out "$D/src" -files "$N" -dirs "$DIRS" -size "$FSIZE" -seed 77 -only-dir $((DIRS / 2))
	CHANGED=$(((N / DIRS + (N % DIRS > DIRS / 2 ? 1 : 0)) * FSIZE))
	timed push3_$N "$BDNVOL" push --json "${JOBS[@]}" "$REPO:v3" "$D/src"
	settle
	timed upgrade$N "$BDNVOL" pull --json "${JOBS[@]}" "$REPO:v3" "$D/pulled"
	FETCHED=$(grep -o '"bytes_fetched":[0-9]*' "$TMP/upgrade$N.out" | tail -1 | cut -d: -f2)
	diff -r -q "$D/src" "$D/pulled" >/dev/null || die "the upgraded tree of $N files differs from the source"

	timed versions$N "$BDNVOL" versions "$REPO"
	timed inspect$N "$BDNVOL" inspect "$REPO:v1"
	timed diff$N "$BDNVOL" diff "$REPO:v1" "$REPO:v2"

	MOUNT_RSS=n/a LS_MNT=n/a LS_MNT2=n/a
	settle
	timed lsp$N sh -c "ls -R '$D/pulled' >/dev/null"
	if have_fuse; then
		MNT=$D/mnt
		mkdir -p "$MNT"
		"$BDNVOL" mount --daemon --prefetch none "$REPO:v1" "$MNT" >"$TMP/mount$N.out" 2>"$TMP/mount$N.err" || {
			cat "$TMP/mount$N.err" >&2
			die "mount of $N files failed"
		}
		MPID=$("$BDNVOL" mounts --json | tr '{' '\n' | grep -F "\"mountpoint\":\"$MNT\"" | grep -o '"pid":[0-9]*' | cut -d: -f2)
		timed lsm$N sh -c "ls -R '$MNT' >/dev/null"
		timed lsm2_$N sh -c "ls -R '$MNT' >/dev/null"
		LS_MNT=${WALL[lsm$N]} LS_MNT2=${WALL[lsm2_$N]}
		[[ -n $MPID ]] && MOUNT_RSS=$(awk '/^VmHWM:/ {print $2}' "/proc/$MPID/status")
		"$BDNVOL" umount "$MNT" >/dev/null 2>&1 || true
		MNT=
	fi

	FPS_B=$(awk -v n="$N" -v s="${WALL[push$N]}" 'BEGIN {printf "%.0f", n / s}')
	FPS_T=$(awk -v n="$N" -v s="${WALL[tar$N]}" 'BEGIN {printf "%.0f", n / s}')
	PR=$(ratio "${WALL[pull$N]}" "${WALL[cp$N]}")
	LR=$(ratio "$LS_MNT" "${WALL[lsp$N]}")
	TR=$(ratio "${WALL[push$N]}" "${WALL[tar$N]}")
	RR=$(ratio "${WALL[push2_$N]}" "${WALL[push$N]}")
	UR=$(ratio "${FETCHED:-0}" "$CHANGED")
	ROWS+=("| $N | push files/s | tar \\| sha256sum: $FPS_T/s | $FPS_B/s ($(ratio "$FPS_B" "$FPS_T")×) | — | — |")
	ROWS+=("| $N | push (s), user+sys | tar \\| sha256sum: ${WALL[tar$N]}, ${CPU[tar$N]} | ${WALL[push$N]}, ${CPU[push$N]} (${TR}×) | ≤ 1.2× | $(check "$TR" 1.2) |")
	ROWS+=("| $N | re-push after a one-file change (s), user+sys | first push: ${WALL[push$N]}, ${CPU[push$N]} | ${WALL[push2_$N]}, ${CPU[push2_$N]} (${RR}×; CPU $(ratio "${CPU[push2_$N]}" "${CPU[push$N]}")×) | ≤ 0.2× | $(check "$RR" 0.2) |")
	ROWS+=("| $N | re-push: index pieces reused / built | — | ${REUSED:-0} / ${BUILT:-0} | — | — |")
	ROWS+=("| $N | re-pull into the previous version (s) | — | ${WALL[repull$N]}, ${CPU[repull$N]} | — | — |")
	ROWS+=("| $N | upgrade, 1 % of files changed: fetched | changed: $(awk -v b="$CHANGED" 'BEGIN {printf "%.2f MiB", b / 1048576}') | $(awk -v b="${FETCHED:-0}" 'BEGIN {printf "%.2f MiB", b / 1048576}') (${UR}×) | ≤ 1.1× | $(check "$UR" 1.1) |")
	ROWS+=("| $N | pull (s), user+sys | cp -r: ${WALL[cp$N]}, ${CPU[cp$N]} | ${WALL[pull$N]}, ${CPU[pull$N]} (${PR}×) | ≤ 1.0× | $(check "$PR" 1.0) |")
	ROWS+=("| $N | pull peak open files | — | $FDS | ≤ jobs + 24 | $(check "$FDS" $((${BENCH_JOBS:-8} + 24))) |")
	LM=$(ratio "${WALL[limited$N]:-0}" "${WALL[pull$N]}")
	ROWS+=("| $N | pull under ulimit -n 256 (s), user+sys | without the limit: ${WALL[pull$N]}, ${CPU[pull$N]} | ${WALL[limited$N]:-n/a}, ${CPU[limited$N]:-n/a} (${LM}×; succeeded: $LIMITED) | ≤ 1.2× | $(check "$LM" 1.2) |")
	ROWS+=("| $N | one-file change uploaded | 1 file: $FSIZE B | $(awk -v b="${UP:-0}" 'BEGIN {printf "%.2f MiB", b / 1048576}') | ≤ 2 MiB | $(check "${UP:-0}" 2097152) |")
	ROWS+=("| $N | ls -R (s) | pulled tree: ${WALL[lsp$N]} | mount: $LS_MNT (${LR}×), again: $LS_MNT2 | ≤ 2.0× | $(check "$LR" 2.0) |")
	for c in push push2_ pull repull upgrade versions inspect diff; do
		ROWS+=("| $N | peak RSS ${c%_} (MiB) | — | $(rssmib "${RSS[$c$N]}") | ≤ 256 | $(check "${RSS[$c$N]}" 262144) |")
	done
	if [[ $MOUNT_RSS != n/a ]]; then
		ROWS+=("| $N | peak RSS mount, after ls -R (MiB) | — | $(rssmib "$MOUNT_RSS") | ≤ 256 | $(check "$MOUNT_RSS" 262144) |")
	fi
	rm -rf "$D"
done

echo
echo "bdnvol on dataset-shaped volumes: files of $FSIZE B in $DIRS directories, distribution $REGISTRY_VERSION on loopback; $(nproc) CPUs."
echo
echo "| files | metric | baseline | bdnvol | target | met |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
if [[ $FAILED == 1 && ${BENCH_STRICT:-0} == 1 ]]; then
	exit 1
fi
