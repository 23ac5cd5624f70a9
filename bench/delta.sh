#!/usr/bin/env bash
# bench/delta.sh — chunks stored as deltas against the version before
# (issue 43, docs/format.md "Format version 3").
#
# Starts a CNCF distribution registry on loopback behind bench/linkproxy
# (no delay, no rate cap: it only counts the bytes it serves), generates a
# synthetic bf16 safetensors checkpoint v1 and pushes it, then measures:
#   rl:       an RL-like step (2 % of the bf16 elements of every tensor moved
#             by ~5 %): bytes uploaded / version bytes, with deltas and with
#             --delta off (into a fresh repository: every chunk plain);
#   finetune: every weight moved by ~1 % (BitX's regime);
#   replaced: one tensor replaced by unrelated values: stored plain;
#   upgrade:  pull of rl into a directory holding v1: bytes fetched / bytes
#             the push uploaded;
#   cold:     pull of rl into an empty directory: bytes fetched / version
#             bytes; CPU (user+sys) and wall against the same version stored
#             plain;
#   mount:    through fresh `bdnvol mount --daemon`s with empty caches, the
#             first mid-shard tensor (mount to its bytes) and a cold cat of
#             every file, delta version against plain, median of 3 each;
#   decode:   delta decode throughput on one core (go test -bench in
#             pkg/layout, 16 MiB bf16 chunks, 2 % changed);
#   link:     the same pulls through a second proxy that emulates an
#             object-store link (BENCH_DELAY, 20ms a request; BENCH_RATE,
#             50MB a second per request and for all requests together):
#             cold pull and pull into a directory holding v1, each of the
#             delta version against the same version stored plain, wall
#             and CPU; push of the RL step plain, with deltas whose bases
#             are downloaded, and with --base-dir (BENCH_LINK=0 leaves
#             these out).
# Prints a Markdown table on stdout; progress goes to stderr.
#
# Environment: BENCH_SIZE (256MiB), BENCH_SHARDS (4), BENCH_LINK (1),
# BENCH_DELAY (20ms), BENCH_RATE (50MB), BENCH_TOOLS,
# BENCH_TMPDIR, BENCH_KEEP=1, BENCH_STRICT=1 (exit 1 when a target is
# missed).
set -euo pipefail
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
SIZE=${BENCH_SIZE:-256MiB}
SHARDS=${BENCH_SHARDS:-4}
REGISTRY_VERSION=v3.1.2

log() { printf 'bench/delta: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

mkdir -p "$BIN"
[[ -x /usr/bin/time ]] || die "needs /usr/bin/time"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
REGISTRY=$BIN/registry
log "building synth, bdnvol and linkproxy"
(cd "$ROOT/e2e" && go build -o "$BIN/synth" ./cmd/synth) || die "building e2e/cmd/synth failed"
(cd "$ROOT" && go build -o "$BIN/bdnvol" ./cmd/bdnvol && go build -o "$BIN/linkproxy" ./bench/linkproxy) || die "building failed"
BDNVOL=$BIN/bdnvol

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench-delta.XXXXXX")
REG_PID= PROXY_PID= LINK_PID=
cleanup() {
	local mp
	for mp in "$TMP"/mnt*; do mountpoint -q "$mp" 2>/dev/null && { "$BDNVOL" umount "$mp" >/dev/null 2>&1 || fusermount3 -u -z "$mp" 2>/dev/null || true; }; done
	[[ -n $PROXY_PID ]] && { kill "$PROXY_PID" 2>/dev/null || true; wait "$PROXY_PID" 2>/dev/null || true; }
	[[ -n $LINK_PID ]] && { kill "$LINK_PID" 2>/dev/null || true; wait "$LINK_PID" 2>/dev/null || true; }
	[[ -n $REG_PID ]] && { kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; }
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export XDG_CACHE_HOME=$TMP/xdg DOCKER_CONFIG=$TMP/docker
mkdir -p "$XDG_CACHE_HOME" "$DOCKER_CONFIG"
start_registry
PLOG=$TMP/proxy.log
"$BIN/linkproxy" -listen 127.0.0.1:0 -target "http://$HOST" -delay 0s -rate 100GB -log "$PLOG" >"$TMP/proxy.addr" 2>"$TMP/proxy.err" &
PROXY_PID=$!
for _ in $(seq 1 100); do [[ -s $TMP/proxy.addr ]] && break; sleep 0.1; done
PHOST=$(head -1 "$TMP/proxy.addr" | sed 's#^http://##')
[[ -n $PHOST ]] || die "linkproxy did not start"
log "registry on $HOST, counted through $PHOST; load: $(uptime | sed 's/.*load/load/')"

# served: bytes the proxy served so far.
served() { awk '{for (i=1;i<=NF;i++) if ($i ~ /^bytes=/) {sub("bytes=","",$i); s+=$i}} END {printf "%d", s}' "$PLOG" 2>/dev/null || echo 0; }
# field JSON NAME: a number field of a one-line JSON object.
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
# timed OUT CMD...: run CMD, stdout to OUT, CPU (user+sys) and wall to $CPU, $WALL.
timed() {
	local out=$1
	shift
	/usr/bin/time -f '%U %S %e' -o "$TMP/time" "$@" >"$out" 2>"$TMP/cmd.err" || { cat "$TMP/cmd.err" >&2; die "$* failed"; }
	read -r u s WALL <"$TMP/time"
	CPU=$(python3 -c "print(round($u+$s,2))")
}
ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }
MISSED=0
check() { # check VALUE OP TARGET
	if ! python3 -c "import sys; sys.exit(0 if $1 $2 $3 else 1)"; then MISSED=1; echo "missed"; else echo "ok"; fi
}

V1=$TMP/v1
log "generating $SIZE checkpoint in $SHARDS shards"
"$BIN/synth" -q -out "$V1" -size "$SIZE" -shards "$SHARDS" -seed 1
"$BIN/synth" -perturb "$V1" -out "$TMP/rl" -fraction 0.02 -seed 2 >/dev/null
"$BIN/synth" -perturb "$V1" -out "$TMP/ft" -fraction 1 -relative 0.01 -seed 3 >/dev/null
"$BIN/synth" -perturb "$V1" -out "$TMP/rep" -fraction 0 -replace model.embed_tokens.weight -seed 4 >/dev/null
R=$PHOST/bench/delta
"$BDNVOL" push "$R:v1" "$V1" >/dev/null 2>"$TMP/push.err" || { cat "$TMP/push.err" >&2; die "push v1 failed"; }

log "pushing the RL step with deltas and plain"
timed "$TMP/rl.json" "$BDNVOL" push --json "$R:rl" "$TMP/rl"
RL=$(cat "$TMP/rl.json") RL_CPU=$CPU RL_WALL=$WALL
timed "$TMP/rlplain.json" "$BDNVOL" push --json --delta off "$PHOST/bench/plain:rl" "$TMP/rl"
RLP=$(cat "$TMP/rlplain.json") RLP_CPU=$CPU RLP_WALL=$WALL
VBYTES=$(field "$RL" bytes)
RL_UP=$(field "$RL" bytes_uploaded)
RL_R=$(ratio "$RL_UP" "$VBYTES")

log "pushing the fine-tune and the replaced tensor"
timed "$TMP/ft.json" "$BDNVOL" push --json --base v1 "$R:ft" "$TMP/ft"
FT=$(cat "$TMP/ft.json")
FT_R=$(ratio "$(field "$FT" bytes_uploaded)" "$(field "$FT" bytes)")
timed "$TMP/rep.json" "$BDNVOL" push --json --base v1 "$R:rep" "$TMP/rep"
REP=$(cat "$TMP/rep.json")
REP_DELTAS=$(field "$REP" delta_chunks) REP_PLAIN=$(field "$REP" bytes_as_chunks)

log "pulls"
settle
timed /dev/null "$BDNVOL" pull "$R:v1" "$TMP/up"
B0=$(served)
settle
timed /dev/null "$BDNVOL" pull "$R:rl" "$TMP/up"
UP_F=$(($(served) - B0)) UP_CPU=$CPU UP_WALL=$WALL
diff -r "$TMP/rl" "$TMP/up" >/dev/null || die "the upgraded directory differs from the RL step"
B0=$(served)
settle
timed /dev/null "$BDNVOL" pull "$R:rl" "$TMP/cold"
COLD_F=$(($(served) - B0)) COLD_CPU=$CPU COLD_WALL=$WALL
diff -r "$TMP/rl" "$TMP/cold" >/dev/null || die "the cold pull differs from the RL step"
B0=$(served)
settle
timed /dev/null "$BDNVOL" pull "$PHOST/bench/plain:rl" "$TMP/coldplain"
PLAIN_F=$(($(served) - B0)) PLAIN_CPU=$CPU PLAIN_WALL=$WALL

log "mounts: first mid-shard tensor and cold cat, delta vs plain, 3 fresh mounts each"
SHARD=$(cd "$TMP/rl" && ls ./*.safetensors | sort | tail -1)
read -r HLEN TOFF TLEN < <(mid_tensor "$TMP/rl/$SHARD")
now() { date +%s%N; }
median() { python3 -c 'import statistics,sys; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.3f}")' "$@"; }
# mount_runs REF NAME: FIRST (seconds from `mount --daemon` to the tensor's
# bytes) and CAT (a cold cat of every file), median of 3 fresh mounts each,
# every mount with an empty cache; the tensor is checked against the tree.
M=0
mount_runs() {
	local ref=$1 firsts=() cats=() i mp t0 t1
	for i in 1 2 3; do
		M=$((M + 1)); mp=$TMP/mnt$M; mkdir -p "$mp"
		settle
		t0=$(now)
		"$BDNVOL" --cache-dir "$TMP/mcache$M" mount --daemon --profile off "$ref" "$mp" >/dev/null 2>"$TMP/mount.err" || { cat "$TMP/mount.err" >&2; die "mount $ref failed"; }
		dd if="$mp/$SHARD" of=/dev/null bs=1M iflag=count_bytes count="$HLEN" status=none
		dd if="$mp/$SHARD" of="$TMP/tensor" bs=1M iflag=skip_bytes,count_bytes skip="$TOFF" count="$TLEN" status=none
		t1=$(now)
		cmp -s "$TMP/tensor" <(dd if="$TMP/rl/$SHARD" bs=1M iflag=skip_bytes,count_bytes skip="$TOFF" count="$TLEN" status=none) || die "$2: the tensor read through the mount differs"
		firsts+=("$(python3 -c "print(($t1 - $t0) / 1e9)")")
		"$BDNVOL" umount "$mp" >/dev/null 2>&1
		M=$((M + 1)); mp=$TMP/mnt$M; mkdir -p "$mp"
		"$BDNVOL" --cache-dir "$TMP/mcache$M" mount --daemon --profile off "$ref" "$mp" >/dev/null 2>"$TMP/mount.err" || { cat "$TMP/mount.err" >&2; die "mount $ref failed"; }
		settle
		t0=$(now)
		find "$mp" -type f -exec cat {} + >/dev/null
		t1=$(now)
		cats+=("$(python3 -c "print(($t1 - $t0) / 1e9)")")
		"$BDNVOL" umount "$mp" >/dev/null 2>&1
	done
	FIRST=$(median "${firsts[@]}") CAT=$(median "${cats[@]}")
	FIRSTS_ALL="${firsts[*]}" CATS_ALL="${cats[*]}"
}
mount_runs "$R:rl" delta
D_FIRST=$FIRST D_CAT=$CAT D_FIRSTS=$FIRSTS_ALL D_CATS=$CATS_ALL
mount_runs "$PHOST/bench/plain:rl" plain
P_FIRST=$FIRST P_CAT=$CAT P_FIRSTS=$FIRSTS_ALL P_CATS=$CATS_ALL

LINK=${BENCH_LINK:-1} LINKROWS=
if [[ $LINK == 1 ]]; then
	DELAY=${BENCH_DELAY:-20ms} RATE=${BENCH_RATE:-50MB}
	log "pulls on the emulated link ($DELAY a request, $RATE/s)"
	"$BIN/linkproxy" -listen 127.0.0.1:0 -target "http://$HOST" -delay "$DELAY" -rate "$RATE" -total "$RATE" >"$TMP/link.addr" 2>"$TMP/link.err" &
	LINK_PID=$!
	for _ in $(seq 1 100); do [[ -s $TMP/link.addr ]] && break; sleep 0.1; done
	LHOST=$(head -1 "$TMP/link.addr" | sed 's#^http://##')
	[[ -n $LHOST ]] || die "the link proxy did not start"
	# link_pull NAME REF DIR [BASEDIR]: pull REF into DIR (a copy of BASEDIR
	# first, when given) on the link, with an empty chunk cache; sets
	# $NAME_CPU and $NAME_WALL.
	link_pull() {
		local name=$1 ref=$2 dir=$3
		rm -rf "$dir" "$TMP/lcache"
		if [[ -n ${4:-} ]]; then cp -a "$4" "$dir"; fi
		settle
		timed /dev/null "$BDNVOL" --cache-dir "$TMP/lcache" pull "$ref" "$dir"
		diff -r "$TMP/rl" "$dir" >/dev/null || die "$name: the pulled directory differs from the RL step"
		printf -v "${name}_CPU" %s "$CPU"
		printf -v "${name}_WALL" %s "$WALL"
	}
	link_pull LD "$LHOST/bench/delta:rl" "$TMP/lcold"
	link_pull LP "$LHOST/bench/plain:rl" "$TMP/lcold"
	link_pull LUD "$LHOST/bench/delta:rl" "$TMP/lup" "$V1"
	link_pull LUP "$LHOST/bench/plain:rl" "$TMP/lup" "$V1"
	rm -rf "$TMP/lcold" "$TMP/lup" "$TMP/lcache"
	# Pushes of the RL step on the link: plain into a new repository,
	# and with deltas into one holding v1 (pushed there on loopback),
	# the bases downloaded or read from v1's directory (--base-dir).
	log "pushes on the emulated link"
	settle
	timed "$TMP/lpp.json" "$BDNVOL" push --json --delta off "$LHOST/bench/linkplain:rl" "$TMP/rl"
	LPP_CPU=$CPU LPP_WALL=$WALL
	for r in linkdelta linkdir; do
		"$BDNVOL" push "$PHOST/bench/$r:v1" "$V1" >/dev/null 2>"$TMP/push.err" || { cat "$TMP/push.err" >&2; die "push v1 to $r failed"; }
	done
	settle
	timed "$TMP/lpd.json" "$BDNVOL" push --json "$LHOST/bench/linkdelta:rl" "$TMP/rl"
	LPD_CPU=$CPU LPD_WALL=$WALL LPD=$(cat "$TMP/lpd.json")
	settle
	timed "$TMP/lpl.json" "$BDNVOL" push --json --base-dir "$V1" "$LHOST/bench/linkdir:rl" "$TMP/rl"
	LPL_CPU=$CPU LPL_WALL=$WALL LPL=$(cat "$TMP/lpl.json")
	[[ $(field "$LPD" digest) == $(field "$LPL" digest) ]] || die "the pushes with and without --base-dir sealed different versions"
	LINKROWS="| cold pull on the link ($DELAY, $RATE/s): delta vs plain, wall / CPU | wall <= 1.0x, CPU <= 1.3x | ${LD_WALL}s vs ${LP_WALL}s: $(ratio "$LD_WALL" "$LP_WALL")x; CPU ${LD_CPU}s vs ${LP_CPU}s: $(ratio "$LD_CPU" "$LP_CPU")x | $(check "$(ratio "$LD_CPU" "$LP_CPU")" "<=" 1.3) |
| pull into a directory holding v1, on the link: delta vs plain, wall / CPU | faster | ${LUD_WALL}s vs ${LUP_WALL}s: $(ratio "$LUD_WALL" "$LUP_WALL")x; CPU ${LUD_CPU}s vs ${LUP_CPU}s: $(ratio "$LUD_CPU" "$LUP_CPU")x | $(check "$LUD_WALL" "<" "$LUP_WALL") |
| push of the RL step on the link, deltas with bases downloaded vs plain: wall / CPU | | ${LPD_WALL}s vs ${LPP_WALL}s: $(ratio "$LPD_WALL" "$LPP_WALL")x; CPU ${LPD_CPU}s vs ${LPP_CPU}s ($(field "$LPD" base_bytes_fetched) base bytes downloaded) | |
| push of the RL step on the link, deltas with --base-dir v1 vs plain: wall / CPU | faster | ${LPL_WALL}s vs ${LPP_WALL}s: $(ratio "$LPL_WALL" "$LPP_WALL")x; CPU ${LPL_CPU}s vs ${LPP_CPU}s ($(field "$LPL" base_bytes_local) base bytes read locally, $(field "$LPL" base_bytes_fetched) downloaded) | $(check "$LPL_WALL" "<" "$LPP_WALL") |"
fi

log "decode throughput"
DEC=$(cd "$ROOT" && GOMAXPROCS=1 go test ./pkg/layout -run '^$' -bench BenchmarkDecodeDelta -benchtime 20x 2>/dev/null | awk '/BenchmarkDecodeDelta/ {for (i=1;i<=NF;i++) if ($(i+1)=="MB/cpu-s") print $i}')

LOAD=$(uptime | sed 's/.*load average: //')
cat <<EOT
### Deltas ($SIZE bf16 checkpoint, $SHARDS shards, distribution on loopback; load average $LOAD)

| case | target | measured | |
|---|---|---|---|
| RL step: bytes uploaded / version bytes | <= 0.06 | $RL_R ($RL_UP of $VBYTES; $(field "$RL" delta_chunks) delta chunks, delta/chunk $(printf %.3f "$(field "$RL" delta_ratio)"); --delta off: $(ratio "$(field "$RLP" bytes_uploaded)" "$VBYTES")) | $(check "$RL_R" "<=" 0.06) |
| push CPU / wall, RL step: deltas vs plain | | ${RL_CPU}s / ${RL_WALL}s vs ${RLP_CPU}s / ${RLP_WALL}s | |
| full fine-tune (every weight ~1 %): bytes uploaded / version bytes | <= 0.6 | $FT_R ($(field "$FT" delta_chunks) delta chunks, delta/chunk $(printf %.3f "$(field "$FT" delta_ratio)")) | $(check "$FT_R" "<=" 0.6) |
| a tensor replaced by unrelated values | stored plain | $REP_DELTAS delta chunks, $REP_PLAIN bytes uploaded plain | $(check "$REP_DELTAS" "==" 0) |
| pull into a directory holding v1: bytes fetched / bytes uploaded | <= 1.05 | $(ratio "$UP_F" "$RL_UP") ($UP_F of $RL_UP) | $(check "$(ratio "$UP_F" "$RL_UP")" "<=" 1.05) |
| cold pull: bytes fetched / version bytes | <= 1.05 | $(ratio "$COLD_F" "$VBYTES") ($COLD_F; the plain version: $(ratio "$PLAIN_F" "$VBYTES")) | $(check "$(ratio "$COLD_F" "$VBYTES")" "<=" 1.05) |
| cold pull CPU, delta vs plain (loopback) | <= 1.3x | ${COLD_CPU}s vs ${PLAIN_CPU}s: $(ratio "$COLD_CPU" "$PLAIN_CPU")x; wall ${COLD_WALL}s vs ${PLAIN_WALL}s: $(ratio "$COLD_WALL" "$PLAIN_WALL")x | $(check "$(ratio "$COLD_CPU" "$PLAIN_CPU")" "<=" 1.3) |
| upgrade pull CPU / wall | | ${UP_CPU}s / ${UP_WALL}s | |
| mount, first mid-shard tensor: delta vs plain (median of 3) | <= 1.2x | ${D_FIRST}s vs ${P_FIRST}s: $(ratio "$D_FIRST" "$P_FIRST")x (runs: $D_FIRSTS vs $P_FIRSTS) | $(check "$(ratio "$D_FIRST" "$P_FIRST")" "<=" 1.2) |
| mount, cold cat of every file: delta vs plain (median of 3) | <= 1.2x | ${D_CAT}s vs ${P_CAT}s: $(ratio "$D_CAT" "$P_CAT")x (runs: $D_CATS vs $P_CATS) | $(check "$(ratio "$D_CAT" "$P_CAT")" "<=" 1.2) |
| decode, one core (MB per CPU second) | >= 1000 | ${DEC:-?} | $(check "${DEC:-0}" ">=" 1000) |
EOT
if [[ -n $LINKROWS ]]; then printf '%s\n' "$LINKROWS"; fi
if [[ ${BENCH_STRICT:-0} == 1 && $MISSED == 1 ]]; then exit 1; fi
