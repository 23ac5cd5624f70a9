#!/usr/bin/env bash
# bench/bench.sh — compare bdnvol with oras on a synthetic checkpoint.
#
# Starts a CNCF distribution registry on a free loopback port (filesystem
# storage in a temp dir), generates a ~2 GiB safetensors checkpoint and a
# fine-tune of it, and measures in one run:
#   push and pull time of oras and bdnvol, bytes uploaded for the fine-tune
#   re-push, no-op re-push time, and peak RSS.
# Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment:
#   BENCH_SIZE     checkpoint size for synth -size (default 2GiB)
#   BENCH_SHARDS   number of shards (default 4)
#   BENCH_FRACTION share of tensor bytes the fine-tune rewrites (default 0.3)
#   BENCH_TOOLS    a directory with prebuilt oras and/or registry binaries to
#                  use instead of `go install` (optional)
#   BENCH_TMPDIR   where the temp dir goes (default $TMPDIR or /tmp)
#   BENCH_KEEP=1   keep the temp dir
#   BENCH_JOBS     bdnvol --jobs, if set
#   BENCH_STRICT=1 exit 1 when a target is missed (errors always exit non-zero)
#   BENCH_TIME     GNU time binary (default /usr/bin/time; a missing one means
#                  peak RSS is polled from /proc, with ~50 ms timing granularity,
#                  and client CPU is not measured)
#   BENCH_LINK=0   skip the realistic-link table
#   BENCH_DELAY    link proxy wait before each request (default 20ms)
#   BENCH_RATE     link proxy rate per request body (default 50MB = 50e6 B/s)
#   BENCH_REFLINK  1: also measure the v1→v2 upgrade on a loop-mounted XFS
#                  image (reflink=1) in the temp dir, on loopback and on the
#                  link; 0: skip it; default: on when run as root with
#                  mkfs.xfs (apt-get install xfsprogs) and losetup
# Page caches are not dropped (that needs root); every input is read once
# before the measurements so both tools see a warm cache, and each run starts
# after a sync, so no run pays for the previous one's writeback.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
SIZE=${BENCH_SIZE:-2GiB}
SHARDS=${BENCH_SHARDS:-4}
FRACTION=${BENCH_FRACTION:-0.3}
ORAS_VERSION=v1.3.6
REGISTRY_VERSION=v3.1.2

log() { printf 'bench: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

mkdir -p "$BIN"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool oras "oras.land/oras/cmd/oras@$ORAS_VERSION" "Version:    ${ORAS_VERSION#v}" version
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
CRANE_VERSION=v0.22.1
install_tool crane "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" "${CRANE_VERSION#v}" version
ORAS=$BIN/oras
REGISTRY=$BIN/registry
CRANE=$BIN/crane

log "building linkproxy"
(cd "$ROOT" && go build -o "$BIN/linkproxy" ./bench/linkproxy) || die "building bench/linkproxy failed"

log "building synth"
(cd "$ROOT/e2e" && go build -o "$BIN/synth" ./cmd/synth) || die "building e2e/cmd/synth failed"

log "building bdnvol"
HAVE_BDNVOL=1
if ! (cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol) >"$BIN/bdnvol-build.log" 2>&1; then
	HAVE_BDNVOL=0
	log "bdnvol does not build yet; measuring oras only (see $BIN/bdnvol-build.log)"
fi
BDNVOL=$BIN/bdnvol

# Peak RSS: GNU time if present (installed with apt when possible), else a
# /proc poller.
TIME_BIN=${BENCH_TIME:-/usr/bin/time}
if [[ ! -x $TIME_BIN ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
	log "installing GNU time"
	apt-get install -y -qq time >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq time >/dev/null 2>&1) || true
fi

# --- scratch space and registry --------------------------------------------

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench.XXXXXX")
REG_PID=
LINK_PID=
XFS_MNT=
cleanup() {
	if [[ -n $XFS_MNT ]]; then
		umount "$XFS_MNT" 2>/dev/null || umount -l "$XFS_MNT" 2>/dev/null || true
	fi
	if [[ -n $LINK_PID ]]; then
		kill "$LINK_PID" 2>/dev/null || true
		wait "$LINK_PID" 2>/dev/null || true
	fi
	if [[ -n $REG_PID ]]; then
		kill "$REG_PID" 2>/dev/null || true
		wait "$REG_PID" 2>/dev/null || true
	fi
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then
		log "kept $TMP"
	else
		rm -rf "$TMP"
	fi
}
trap cleanup EXIT

start_registry

# --- data ----------------------------------------------------------------------

MODEL=$TMP/model
FT=$TMP/finetune
log "generating $SIZE checkpoint in $SHARDS shards"
"$BIN/synth" -out "$MODEL" -size "$SIZE" -shards "$SHARDS" -seed 1
"$BIN/synth" -finetune "$MODEL" -out "$FT" -fraction "$FRACTION" >"$TMP/finetune.json"
MODEL_BYTES=$(du -sb "$MODEL" | cut -f1)

# Warm-up: read every input once so both tools start from a warm page cache.
cat "$MODEL"/* "$FT"/* >/dev/null

# --- measuring -----------------------------------------------------------------

declare -A WALL RSS CPU

# measure NAME CMD...: runs CMD (stdout to $TMP/NAME.out), records wall seconds
# in WALL[NAME] and peak RSS in KiB in RSS[NAME].
measure() {
	local name=$1
	shift
	log "running $name"
	local t0 t1 rc=0
	# Start each run with no dirty pages left by the one before, so that
	# neither tool pays for the other's writeback, and with the same free
	# memory (settle, bench/lib.sh).
	settle "$MODEL" "$FT" "$BIN"
	t0=$(date +%s%N)
	if [[ -x $TIME_BIN ]]; then
		"$TIME_BIN" -v -o "$TMP/$name.time" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || rc=$?
		t1=$(date +%s%N)
		RSS[$name]=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$TMP/$name.time")
		CPU[$name]=$(awk -F': ' '/User time \(seconds\)/ {u = $2} /System time \(seconds\)/ {s = $2} END {printf "%.2f", u + s}' "$TMP/$name.time")
	else
		"$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
		local pid=$! peak=0 v
		while kill -0 "$pid" 2>/dev/null; do
			v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
			[[ -n $v && $v -gt $peak ]] && peak=$v
			sleep 0.05
		done
		wait "$pid" || rc=$?
		t1=$(date +%s%N)
		RSS[$name]=$peak
		CPU[$name]=0
	fi
	WALL[$name]=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", (b - a) / 1e9}')
	if [[ $rc != 0 ]]; then
		cat "$TMP/$name.err" >&2
		die "$name failed (exit $rc): $*"
	fi
}

files_of() { (cd "$1" && find . -maxdepth 1 -type f -printf '%f\n' | sort); }

# same_tree A B: every file of A is in B with the same bytes.
same_tree() {
	local f
	for f in $(files_of "$1"); do
		cmp -s "$1/$f" "$2/$f" || die "pulled $2/$f differs from $1/$f"
	done
}

# oras ----------------------------------------------------------------------
export DOCKER_CONFIG=$TMP/docker # no credentials needed, none read
mkdir -p "$DOCKER_CONFIG"
# measure_in runs measure in DIR, in a subshell, and passes its results back.
measure_in() { # DIR NAME CMD...
	local dir=$1 name=$2
	shift 2
	(
		cd "$dir"
		measure "$name" "$@"
		echo "${WALL[$name]}" >"$TMP/$name.wall"
		echo "${RSS[$name]}" >"$TMP/$name.rss"
		echo "${CPU[$name]}" >"$TMP/$name.cpu"
	)
	WALL[$name]=$(cat "$TMP/$name.wall")
	RSS[$name]=$(cat "$TMP/$name.rss")
	CPU[$name]=$(cat "$TMP/$name.cpu")
}
oras_push() { # DIR TAG NAME [HOST [REPO]]
	# shellcheck disable=SC2046
	measure_in "$1" "$3" "$ORAS" push --plain-http --no-tty --export-manifest "$TMP/$3.manifest.json" \
		"${4:-$HOST}/${5:-oras}:$2" $(files_of "$1")
}

# layers MANIFEST: "digest size" per layer.
layers() {
	tr -d ' \n' <"$1" | sed 's/.*"layers":\[//' | grep -o '"digest":"sha256:[0-9a-f]*","size":[0-9]*' |
		sed 's/"digest":"\([^"]*\)","size":\([0-9]*\)/\1 \2/'
}

oras_push "$MODEL" v1 oras_push
measure oras_pull "$ORAS" pull --plain-http --no-tty -o "$TMP/oras-out" "$HOST/oras:v1"
same_tree "$MODEL" "$TMP/oras-out"
# crane pulls the same artifact as an OCI layout (blobs, not files).
# try_measure NAME CMD...: measure, but a failure only logs (crane may not
# take an artifact that is not an image); returns non-zero then.
try_measure() {
	local name=$1
	if (measure "$@" && echo "${WALL[$name]} ${CPU[$name]} ${RSS[$name]}" >"$TMP/$name.res"); then
		read -r "WALL[$name]" "CPU[$name]" "RSS[$name]" <"$TMP/$name.res"
		return 0
	fi
	log "$name failed; its row is left out"
	return 1
}
HAVE_CRANE=0
try_measure crane_pull "$CRANE" pull --insecure --format oci "$HOST/oras:v1" "$TMP/crane-out" && HAVE_CRANE=1
oras_push "$MODEL" v1 oras_noop
oras_push "$FT" v2 oras_ft
ORAS_FT_BYTES=$(awk 'NR == FNR {old[$1] = 1; next} !($1 in old) {n += $2} END {printf "%d", n}' \
	<(layers "$TMP/oras_push.manifest.json") <(layers "$TMP/oras_ft.manifest.json"))
[[ $(layers "$TMP/oras_push.manifest.json" | wc -l) -gt 0 ]] || die "could not read layers from the oras manifest"

# bdnvol ----------------------------------------------------------------------
bytes_uploaded() { grep -o '"bytes_uploaded":[0-9]*' "$1" | tail -1 | cut -d: -f2; }
if [[ $HAVE_BDNVOL == 1 ]]; then
	export XDG_CACHE_HOME=$TMP/cache # fresh stat cache for the first push
	JOBS=()
	[[ -n ${BENCH_JOBS:-} ]] && JOBS=(--jobs "$BENCH_JOBS")
	measure bdnvol_push "$BDNVOL" push --json "${JOBS[@]}" "$HOST/bdnvol:v1" "$MODEL"
	measure bdnvol_pull "$BDNVOL" pull "${JOBS[@]}" "$HOST/bdnvol:v1" "$TMP/bdnvol-out"
	same_tree "$MODEL" "$TMP/bdnvol-out"
	# No-op re-push keeps the stat cache: that is what makes it cheap.
	measure bdnvol_noop "$BDNVOL" push --json "${JOBS[@]}" "$HOST/bdnvol:v1" "$MODEL"
	measure bdnvol_ft "$BDNVOL" push --json "${JOBS[@]}" "$HOST/bdnvol:v2" "$FT"
	# Upgrade: v2 into the directory holding v1, against a cold pull of v2.
	measure bdnvol_up "$BDNVOL" pull --json "${JOBS[@]}" "$HOST/bdnvol:v2" "$TMP/bdnvol-out"
	same_tree "$FT" "$TMP/bdnvol-out"
	measure bdnvol_pull2 "$BDNVOL" pull --json "${JOBS[@]}" "$HOST/bdnvol:v2" "$TMP/bdnvol-out2"
	BDNVOL_UP_FETCHED=$(grep -o '"bytes_fetched":[0-9]*' "$TMP/bdnvol_up.out" | cut -d: -f2)
	BDNVOL_FT_BYTES=$(bytes_uploaded "$TMP/bdnvol_ft.out")
	[[ -n $BDNVOL_FT_BYTES ]] || die "no bytes_uploaded in: $(cat "$TMP/bdnvol_ft.out")"
	BDNVOL_NOOP_BYTES=$(bytes_uploaded "$TMP/bdnvol_noop.out")
fi

# --- realistic link ----------------------------------------------------------
# The same registry behind bench/linkproxy: BENCH_DELAY before each request,
# each request's body paced at BENCH_RATE (an object-store-backed registry in
# another region).
LINK=${BENCH_LINK:-1}
if [[ $LINK == 1 && $HAVE_BDNVOL == 1 ]]; then
	"$BIN/linkproxy" -target "http://$HOST" -delay "${BENCH_DELAY:-20ms}" -rate "${BENCH_RATE:-50MB}" >"$TMP/linkproxy.addr" 2>"$TMP/linkproxy.log" &
	LINK_PID=$!
	for _ in $(seq 1 100); do [[ -s $TMP/linkproxy.addr ]] && break; sleep 0.1; done
	LHOST=$(head -1 "$TMP/linkproxy.addr")
	[[ -n $LHOST ]] || die "linkproxy did not start: $(cat "$TMP/linkproxy.log")"
	log "link proxy on $LHOST"
	# A repository of its own: the registry has the blobs in "oras" already.
	oras_push "$MODEL" v1 l_oras_push "$LHOST" oras-link
	measure l_oras_pull "$ORAS" pull --plain-http --no-tty -o "$TMP/l-oras-out" "$LHOST/oras-link:v1"
	HAVE_LCRANE=0
	try_measure l_crane_pull "$CRANE" pull --insecure --format oci "$LHOST/oras-link:v1" "$TMP/l-crane-out" && HAVE_LCRANE=1
	export XDG_CACHE_HOME=$TMP/cache-link
	measure l_bdnvol_push "$BDNVOL" push --json "${JOBS[@]}" "$LHOST/blink:v1" "$MODEL"
	measure l_bdnvol_pull "$BDNVOL" pull --json "${JOBS[@]}" "$LHOST/blink:v1" "$TMP/l-out"
	same_tree "$MODEL" "$TMP/l-out"
	measure l_bdnvol_ft "$BDNVOL" push --json "${JOBS[@]}" "$LHOST/blink:v2" "$FT"
	measure l_bdnvol_up "$BDNVOL" pull --json "${JOBS[@]}" "$LHOST/blink:v2" "$TMP/l-out"
	same_tree "$FT" "$TMP/l-out"
	measure l_bdnvol_pull2 "$BDNVOL" pull --json "${JOBS[@]}" "$LHOST/blink:v2" "$TMP/l-out2"
	L_UP_FETCHED=$(grep -o '"bytes_fetched":[0-9]*' "$TMP/l_bdnvol_up.out" | cut -d: -f2)
fi

# --- upgrade where the file system shares extents -----------------------------
# On ext4 an upgrade copies every unchanged byte into the new files (renames
# are atomic, so unchanged tensors cannot stay where they are); XFS with
# reflink, like btrfs, clones those blocks instead. Measured on an XFS image
# mounted from a loop device inside TMP: pull v1, upgrade to v2 (timed), and
# a cold pull of v2 into an empty directory of the same file system.
REFLINK=${BENCH_REFLINK:-auto}
if [[ $REFLINK == auto ]]; then
	REFLINK=0
	if [[ $(id -u) == 0 ]] && command -v mkfs.xfs >/dev/null && command -v losetup >/dev/null; then
		REFLINK=1
	else
		log "no XFS upgrade rows: they need root, mkfs.xfs (xfsprogs) and losetup"
	fi
fi
HAVE_XFS=0
if [[ $REFLINK == 1 && $HAVE_BDNVOL == 1 ]]; then
	truncate -s $((3 * MODEL_BYTES + (1 << 30))) "$TMP/xfs.img" # v1/v2 directory, cold v2, slack
	mkfs.xfs -q -m reflink=1 "$TMP/xfs.img" || die "mkfs.xfs failed"
	mkdir -p "$TMP/xfs"
	mount -o loop "$TMP/xfs.img" "$TMP/xfs" || die "cannot mount the XFS image (loop devices?)"
	XFS_MNT=$TMP/xfs
	HAVE_XFS=1
	xfs_upgrade() { # PREFIX HOST REPO
		export XDG_CACHE_HOME=$TMP/cache-$1
		"$BDNVOL" pull "${JOBS[@]}" "$2/$3:v1" "$XFS_MNT/$1-up" >/dev/null 2>"$TMP/$1-v1.err" ||
			die "pull of v1 into XFS failed: $(cat "$TMP/$1-v1.err")"
		measure "$1_up" "$BDNVOL" pull --json "${JOBS[@]}" "$2/$3:v2" "$XFS_MNT/$1-up"
		same_tree "$FT" "$XFS_MNT/$1-up"
		measure "$1_pull2" "$BDNVOL" pull --json "${JOBS[@]}" "$2/$3:v2" "$XFS_MNT/$1-cold"
		rm -rf "${XFS_MNT:?}/$1-up" "${XFS_MNT:?}/$1-cold"
	}
	xfs_upgrade x "$HOST" bdnvol
	if [[ $LINK == 1 ]]; then
		xfs_upgrade lx "$LHOST" blink
	fi
fi

# --- report ------------------------------------------------------------------

mib() { awk -v b="$1" 'BEGIN {if (b < 1048576) printf "%.1f KiB", b / 1024; else printf "%.1f MiB", b / 1048576}'; }
FT_CHANGED=$(grep -o '"ChangedTensorBytes": [0-9]*' "$TMP/finetune.json" | grep -o '[0-9]*$')
FT_NEW=$(grep -o '"NewTensorBytes": [0-9]*' "$TMP/finetune.json" | grep -o '[0-9]*$')

FAILED=0
# row METRIC ORAS BDNVOL ORAS_NUM BDNVOL_NUM OP LIMIT TARGET_TEXT [absolute]
# The ratio is BDNVOL_NUM/ORAS_NUM; the check is ratio OP LIMIT (or, with
# "absolute", BDNVOL_NUM OP LIMIT).
row() {
	local metric=$1 o=$2 b=$3 on=$4 bn=$5 op=$6 limit=$7 target=$8 abs=${9:-}
	local ratio="n/a" ok="n/a" val
	if [[ $HAVE_BDNVOL == 1 ]]; then
		ok=""
		if [[ $on != 0 ]]; then
			ratio=$(awk -v a="$bn" -v b="$on" 'BEGIN {printf "%.3f", a / b}')
		fi
		val=$ratio
		[[ -n $abs ]] && val=$bn
		if [[ $val != "n/a" && $limit != - ]]; then
			if awk -v v="$val" -v l="$limit" 'BEGIN {exit !(v <= l)}'; then ok="yes"; else
				ok="**no**"
				FAILED=1
			fi
		fi
	else
		b="n/a"
	fi
	printf '| %s | %s | %s | %s | %s %s | %s |\n' "$metric" "$o" "$b" "$ratio" "$op" "$target" "$ok"
}

rssmib() { awk -v k="$1" 'BEGIN {printf "%.0f", k / 1024}'; }

echo
echo "bdnvol vs oras $ORAS_VERSION, distribution $REGISTRY_VERSION on loopback; $(mib "$MODEL_BYTES") in $SHARDS shards;"
echo "fine-tune rewrites $(mib "$FT_CHANGED") of tensors and adds $(mib "$FT_NEW"); $(nproc) CPUs; warm page cache."
echo
echo "| metric | oras | bdnvol | ratio | target | met |"
echo "|---|---|---|---|---|---|"
B() { [[ $HAVE_BDNVOL == 1 ]] && echo "$1" || echo 0; }
row "push (s)" "${WALL[oras_push]}" "$(B "${WALL[bdnvol_push]:-}")" "${WALL[oras_push]}" "$(B "${WALL[bdnvol_push]:-}")" "≤" 1.0 "1.0×"
row "push client CPU (s)" "${CPU[oras_push]}" "$(B "${CPU[bdnvol_push]:-}")" "${CPU[oras_push]}" "$(B "${CPU[bdnvol_push]:-}")" "≤" 1.2 "1.2×"
row "pull (s)" "${WALL[oras_pull]}" "$(B "${WALL[bdnvol_pull]:-}")" "${WALL[oras_pull]}" "$(B "${WALL[bdnvol_pull]:-}")" "≤" 1.0 "1.0×"
row "pull client CPU (s)" "${CPU[oras_pull]}" "$(B "${CPU[bdnvol_pull]:-}")" "${CPU[oras_pull]}" "$(B "${CPU[bdnvol_pull]:-}")" "≤" 0.8 "0.8×"
if [[ $HAVE_CRANE == 1 ]]; then
	row "pull vs crane (s)" "crane ${WALL[crane_pull]}" "$(B "${WALL[bdnvol_pull]:-}")" "${WALL[crane_pull]}" "$(B "${WALL[bdnvol_pull]:-}")" "" - "—"
	row "pull client CPU vs crane (s)" "crane ${CPU[crane_pull]}" "$(B "${CPU[bdnvol_pull]:-}")" "${CPU[crane_pull]}" "$(B "${CPU[bdnvol_pull]:-}")" "" - "—"
fi
row "fine-tune re-push uploaded" "$(mib "$ORAS_FT_BYTES")" "$(mib "$(B "${BDNVOL_FT_BYTES:-}")")" "$ORAS_FT_BYTES" "$(B "${BDNVOL_FT_BYTES:-}")" "≤" 0.34 "0.34×"
row "fine-tune re-push (s)" "${WALL[oras_ft]}" "$(B "${WALL[bdnvol_ft]:-}")" "${WALL[oras_ft]}" "$(B "${WALL[bdnvol_ft]:-}")" "" - "—"
row "no-op re-push (s)" "${WALL[oras_noop]}" "$(B "${WALL[bdnvol_noop]:-}")" "${WALL[oras_noop]}" "$(B "${WALL[bdnvol_noop]:-}")" "≤" 0.1 "0.1×"
row "no-op re-push vs oras push (s)" "push ${WALL[oras_push]}" "$(B "${WALL[bdnvol_noop]:-}")" "${WALL[oras_push]}" "$(B "${WALL[bdnvol_noop]:-}")" "≤" 0.05 "0.05×"
row "v1→v2 upgrade vs cold pull of v2 (s)" "cold ${WALL[bdnvol_pull2]:-0}" "$(B "${WALL[bdnvol_up]:-}")" "${WALL[bdnvol_pull2]:-0}" "$(B "${WALL[bdnvol_up]:-}")" "≤" 0.35 "0.35×"
row "v1→v2 upgrade fetched vs changed tensors" "$(mib $((FT_CHANGED + FT_NEW)))" "$(mib "$(B "${BDNVOL_UP_FETCHED:-}")")" $((FT_CHANGED + FT_NEW)) "$(B "${BDNVOL_UP_FETCHED:-}")" "≤" 1.05 "1.05×"
row "peak RSS push (MiB)" "$(rssmib "${RSS[oras_push]}")" "$(rssmib "$(B "${RSS[bdnvol_push]:-}")")" "${RSS[oras_push]}" "$(B "${RSS[bdnvol_push]:-}")" "≤" 262144 "256 MiB" absolute
row "peak RSS pull (MiB)" "$(rssmib "${RSS[oras_pull]}")" "$(rssmib "$(B "${RSS[bdnvol_pull]:-}")")" "${RSS[oras_pull]}" "$(B "${RSS[bdnvol_pull]:-}")" "≤" 262144 "256 MiB" absolute
if [[ $LINK == 1 && $HAVE_BDNVOL == 1 ]]; then
	echo
	echo "Realistic link: bench/linkproxy in front of the same registry, ${BENCH_DELAY:-20ms} before each request, ${BENCH_RATE:-50MB}/s per request body."
	echo
	echo "| metric | oras | bdnvol | ratio | target | met |"
	echo "|---|---|---|---|---|---|"
	row "push (s)" "${WALL[l_oras_push]}" "${WALL[l_bdnvol_push]}" "${WALL[l_oras_push]}" "${WALL[l_bdnvol_push]}" "≤" 1.0 "1.0×"
	row "push client CPU (s)" "${CPU[l_oras_push]}" "${CPU[l_bdnvol_push]}" "${CPU[l_oras_push]}" "${CPU[l_bdnvol_push]}" "" - "—"
	row "cold pull (s)" "${WALL[l_oras_pull]}" "${WALL[l_bdnvol_pull]}" "${WALL[l_oras_pull]}" "${WALL[l_bdnvol_pull]}" "≤" 1.0 "1.0×"
	row "cold pull client CPU (s)" "${CPU[l_oras_pull]}" "${CPU[l_bdnvol_pull]}" "${CPU[l_oras_pull]}" "${CPU[l_bdnvol_pull]}" "" - "—"
	if [[ $HAVE_LCRANE == 1 ]]; then
		row "cold pull vs crane (s)" "crane ${WALL[l_crane_pull]}" "${WALL[l_bdnvol_pull]}" "${WALL[l_crane_pull]}" "${WALL[l_bdnvol_pull]}" "" - "—"
	fi
	row "v1→v2 upgrade vs cold pull of v2 (s)" "cold ${WALL[l_bdnvol_pull2]}" "${WALL[l_bdnvol_up]}" "${WALL[l_bdnvol_pull2]}" "${WALL[l_bdnvol_up]}" "≤" 0.35 "0.35×"
	row "v1→v2 upgrade fetched vs changed tensors" "$(mib $((FT_CHANGED + FT_NEW)))" "$(mib "${L_UP_FETCHED:-0}")" $((FT_CHANGED + FT_NEW)) "${L_UP_FETCHED:-0}" "≤" 1.05 "1.05×"
	row "peak RSS pull (MiB)" "$(rssmib "${RSS[l_oras_pull]}")" "$(rssmib "${RSS[l_bdnvol_pull]}")" "${RSS[l_oras_pull]}" "${RSS[l_bdnvol_pull]}" "≤" 262144 "256 MiB" absolute
fi
if [[ $HAVE_XFS == 1 ]]; then
	echo
	echo "Upgrade on XFS with reflink (a loop-mounted image), v2 into the directory holding v1, against a cold pull of v2 on the same file system."
	echo
	echo "| metric | cold pull | upgrade | ratio | target | met |"
	echo "|---|---|---|---|---|---|"
	row "loopback: v1→v2 upgrade vs cold pull of v2 (s)" "${WALL[x_pull2]}" "${WALL[x_up]}" "${WALL[x_pull2]}" "${WALL[x_up]}" "≤" 0.35 "0.35×"
	if [[ $LINK == 1 ]]; then
		row "realistic link: v1→v2 upgrade vs cold pull of v2 (s)" "${WALL[lx_pull2]}" "${WALL[lx_up]}" "${WALL[lx_pull2]}" "${WALL[lx_up]}" "≤" 0.35 "0.35×"
	fi
fi
if [[ $HAVE_BDNVOL == 1 ]]; then
	echo
	echo "bdnvol no-op re-push uploaded $(mib "${BDNVOL_NOOP_BYTES:-0}"); ratio = bdnvol / oras."
else
	echo
	echo "bdnvol did not build: only oras was measured."
fi
if [[ $FAILED == 1 && ${BENCH_STRICT:-0} == 1 ]]; then
	exit 1
fi
