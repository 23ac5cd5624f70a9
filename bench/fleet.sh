#!/usr/bin/env bash
# bench/fleet.sh — N nodes start one version at once, with and without the
# peer tier.
#
# Starts a CNCF distribution registry behind bench/linkproxy (a shared link:
# BENCH_RATE, default 50MB/s = 400 Mbit/s for all requests together, and
# BENCH_DELAY, default 20ms before each request), pushes a synthetic
# checkpoint (BENCH_SIZE, default 1GiB, in BENCH_SHARDS shards) straight to
# the registry, and for each N in BENCH_NODES (default "1 4 8") starts N
# `bdnvol csi mounter` processes on this machine, each with its own cache
# directory, socket and peer address on loopback (nodes reach one another
# without the link), asks each for a mount of the version over its socket at
# once, and reads every file of every mount. It prints, per N: the bytes
# that crossed the link (blob bodies) over the version's bytes, the time
# until all N nodes had read the whole version over the time of N = 1, and
# the mounters' CPU (user+sys) in all; first with the peer tier, then (the
# peer) without it. Then a node that joins once the others finished.
# Then, with the peer tier, per N (rows "kill" and "liar" from N = 2): the
# owner of 1/N of the chunks killed half-way (the others must read every
# byte right), a peer that serves wrong bytes for every chunk (a proxy in
# front of it flips a byte), N `bdnvol pull`s at once (--peer-listen), and
# a warm-list rollout (the mounters' --warm-list names the version, all
# warm it); each with the link bytes over the version's bytes, the time
# and the clients' CPU (user+sys).
# Needs root (FUSE mounts of the mounter) and /dev/fuse.
#
# Environment: BENCH_SIZE, BENCH_SHARDS, BENCH_NODES, BENCH_MODES ("1 0":
# with the peer tier, then without), BENCH_ROWS (default "fleet kill liar
# pull warm"), BENCH_RATE,
# BENCH_DELAY, BENCH_TMPDIR, BENCH_KEEP=1, BENCH_TOOLS (as bench/mount.sh),
# BENCH_MEMBERSHIP: k8s (the default when `make cluster-tools` has built
# Kubernetes and this machine has a non-loopback address) runs a real API
# server (bench/kubeapi) and gives the fleet rows' mounters their membership
# from EndpointSlices of the peers Service and their mutual TLS from the CA
# Secret, as the chart does (one EndpointSlice per node, as the controller
# would write them for mounter pods; addresses on this machine's address,
# since EndpointSlices refuse loopback); static: the --peers list on
# loopback, plain HTTP. The kill, liar, pull and warm rows use static.
set -euo pipefail
TOOLS_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/bdnvol-tools

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bench/.bin
SIZE=${BENCH_SIZE:-1GiB}
SHARDS=${BENCH_SHARDS:-4}
NODES=${BENCH_NODES:-1 4 8}
RATE=${BENCH_RATE:-50MB}
DELAY=${BENCH_DELAY:-20ms}
REGISTRY_VERSION=v3.1.2

log() { printf 'bench/fleet: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b - a) / 1e9}'; }

[[ $(id -u) == 0 ]] || die "needs root (the mounter's FUSE mounts)"
[[ -e /dev/fuse ]] || die "no /dev/fuse"
command -v curl >/dev/null || die "needs curl"
mkdir -p "$BIN"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" " $REGISTRY_VERSION" --version
REGISTRY=$BIN/registry
log "building synth, linkproxy and bdnvol"
(cd "$ROOT/e2e" && go build -o "$BIN/synth" ./cmd/synth) || die "building e2e/cmd/synth failed"
(cd "$ROOT" && go build -o "$BIN/linkproxy" ./bench/linkproxy && go build -o "$BIN/bdnvol" ./cmd/bdnvol) || die "build failed"
BDNVOL=$BIN/bdnvol

# The membership of the fleet rows (BENCH_MEMBERSHIP).
MEMBERSHIP=${BENCH_MEMBERSHIP:-auto}
HOSTIP=$(hostname -I 2>/dev/null | awk '{print $1}')
KDIR=$(ls -d "$TOOLS_CACHE"/kubernetes-* 2>/dev/null | tail -1 || true)
if [[ $MEMBERSHIP == auto ]]; then
	if [[ -n $HOSTIP && -x $KDIR/kube-apiserver ]]; then MEMBERSHIP=k8s; else MEMBERSHIP=static; fi
fi
[[ $MEMBERSHIP == k8s && -z $HOSTIP ]] && die "BENCH_MEMBERSHIP=k8s needs a non-loopback address (EndpointSlices refuse loopback)"
log "fleet membership: $MEMBERSHIP"

TMP=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/bdnvol-bench-fleet.XXXXXX")
REG_PID=
LINK_PID=
PIDS=()
NODE_PIDS=()
NODE_FLAGS=()
stop_nodes() {
	local p
	[[ -n ${KUBECTL:-} ]] && { $KUBECTL delete endpointslice -n kube-system -l bench=fleet --wait=false >/dev/null 2>&1 || true; }
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	PIDS=()
	{ grep " $TMP/" /proc/self/mountinfo 2>/dev/null || true; } | awk '{print $5}' | while read -r mp; do
		fusermount3 -u -z "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
	done
}
cleanup() {
	stop_nodes
	[[ -n ${KUBE_PID:-} ]] && { kill -TERM "$KUBE_PID" 2>/dev/null || true; wait "$KUBE_PID" 2>/dev/null || true; }
	[[ -n $LINK_PID ]] && { kill "$LINK_PID" 2>/dev/null || true; wait "$LINK_PID" 2>/dev/null || true; }
	[[ -n $REG_PID ]] && { kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; }
	if [[ ${BENCH_KEEP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export XDG_CACHE_HOME=$TMP/xdg DOCKER_CONFIG=$TMP/docker
mkdir -p "$XDG_CACHE_HOME" "$DOCKER_CONFIG"

start_registry
DIRECT=$HOST
KUBECTL=
KUBE_PID=
if [[ $MEMBERSHIP == k8s ]]; then
	(cd "$ROOT" && go build -o "$BIN/kubeapi" ./bench/kubeapi) || die "building bench/kubeapi failed"
	mkdir -p "$TMP/kube"
	"$BIN/kubeapi" -dir "$TMP/kube" -tools "$TOOLS_CACHE" -gomod "$ROOT/internal/tools/k8sbuild/go.mod" >"$TMP/kube.out" 2>"$TMP/kube.err" &
	KUBE_PID=$!
	for _ in $(seq 1 1800); do grep -q ready "$TMP/kube.out" 2>/dev/null && break; kill -0 "$KUBE_PID" 2>/dev/null || break; sleep 0.1; done
	grep -q ready "$TMP/kube.out" || die "the API server did not start: $(cat "$TMP/kube.err")"
	KUBECTL="$KDIR/kubectl --kubeconfig $TMP/kube/kubeconfig --request-timeout=30s"
	log "API server up ($TMP/kube)"
fi

# add_slice NAME HOST PORT: an EndpointSlice of the peers Service naming one
# ready mounter, as the EndpointSlice controller writes one for a pod.
add_slice() {
	$KUBECTL apply -f - >/dev/null <<-EOF
	apiVersion: discovery.k8s.io/v1
	kind: EndpointSlice
	metadata:
	  name: $1
	  namespace: kube-system
	  labels: {kubernetes.io/service-name: bdnvol-csi-peers, bench: fleet}
	addressType: IPv4
	endpoints: [{addresses: ["$2"], conditions: {ready: true}}]
	ports: [{name: peer, port: $3, protocol: TCP}]
	EOF
}

# wait_members LOG N: until the mounter logging to LOG sees N members.
wait_members() {
	for _ in $(seq 1 600); do
		grep -qE "\"msg\":\"peer membership\".*\"members\":$2[,}]" "$1" && return 0
		sleep 0.1
	done
	die "the mounter of $1 did not see $2 members: $(tail -3 "$1")"
}
"$BIN/linkproxy" -target "http://$DIRECT" -delay "$DELAY" -rate 10GB -total "$RATE" -log "$TMP/link.log" >"$TMP/link.addr" 2>"$TMP/link.err" &
LINK_PID=$!
for _ in $(seq 1 100); do [[ -s $TMP/link.addr ]] && break; sleep 0.1; done
LINK=$(head -1 "$TMP/link.addr")
[[ -n $LINK ]] || die "linkproxy did not start"

MODEL=$TMP/model
log "generating $SIZE checkpoint in $SHARDS shards"
"$BIN/synth" -q -out "$MODEL" -size "$SIZE" -shards "$SHARDS" -seed 1
MODEL_BYTES=$(du -sb "$MODEL" | cut -f1)
PINNED=$("$BDNVOL" push "$DIRECT/fleet:v1" "$MODEL" 2>/dev/null | tail -1)
DIGEST=${PINNED##*@}
REF=$LINK/fleet@$DIGEST
log "version $DIGEST, $MODEL_BYTES bytes"

# link_bytes: blob body bytes the link has carried so far.
link_bytes() { awk '/\/blobs\// {for (i = 1; i <= NF; i++) if ($i ~ /^bytes=/) {sub("bytes=", "", $i); s += $i}} END {printf "%.0f\n", s}' "$TMP/link.log"; }

# cpu_of PID...: user+sys seconds of the processes (from /proc, before they exit).
cpu_of() {
	local t=0 p tk
	tk=$(getconf CLK_TCK)
	for p in "$@"; do
		[[ -r /proc/$p/stat ]] || continue
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	awk -v t="$t" -v k="$tk" 'BEGIN {printf "%.1f", t / k}'
}

# free_port: a loopback port nothing listens on.
free_port() {
	local port
	while :; do port=$((20000 + RANDOM % 40000)); port_free "$port" && break; done
	echo "$port"
}

# start_nodes N PEERS(0|1) TAG: start N mounters; sets SOCKS and PIDS.
# NODE_FLAGS (an array) are added to every mounter's flags; with LIAR=1 the
# last node's peers reach it through a linkproxy -corrupt that flips a byte
# of every chunk it serves (its advertised address; its requests log in
# $TMP/$TAG/liar.log).
start_nodes() {
	local n=$1 peers=$2 tag=$3 i addrs=() listen=()
	SOCKS=()
	NODE_PIDS=()
	for i in $(seq 1 "$n"); do
		listen+=("127.0.0.$((i + 1)):$(free_port)")
		addrs+=("${listen[$((i - 1))]}")
	done
	mkdir -p "$TMP/$tag"
	if [[ ${LIAR:-0} == 1 ]]; then
		local lp=127.0.0.$((n + 1)):$(free_port)
		"$BIN/linkproxy" -listen "$lp" -target "http://${listen[$((n - 1))]}" -delay 0s -rate 10GB -corrupt \
			-log "$TMP/$tag/liar.log" >/dev/null 2>"$TMP/$tag/liar.err" &
		PIDS+=($!)
		addrs[$((n - 1))]=$lp
	fi
	local all
	all=$(IFS=,; echo "${addrs[*]}")
	for i in $(seq 1 "$n"); do
		local d=$TMP/$tag/node$i
		mkdir -p "$d/state" "$d/mounts"
		local flags=("${NODE_FLAGS[@]}")
		if [[ $peers == 1 && -n $KUBECTL && ${LIAR:-0} != 1 && ${K8S_ROW:-0} == 1 ]]; then
			local port
			port=$(free_port)
			listen[$((i - 1))]=$HOSTIP:$port
			add_slice "bench-$tag-$i" "$HOSTIP" "$port"
			flags+=(--peer-listen "$HOSTIP:$port" --peer-service kube-system/bdnvol-csi-peers
				--peer-tls-secret kube-system/bdnvol-csi-peer-ca)
		elif [[ $peers == 1 ]]; then
			flags+=(--peer-listen "${listen[$((i - 1))]}" --peer-advertise "${addrs[$((i - 1))]}" --peers "$all" --peer-insecure)
		fi
		KUBECONFIG=$TMP/kube/kubeconfig "$BDNVOL" --cache-dir "$d/cache" csi mounter --mounter-socket "$d/mounter.sock" --state-dir "$d/state" \
			--mounts-dir "$d/mounts" --hosts-dir none --profile off --cache-size 4GiB "${flags[@]}" 2>"$d/mounter.log" &
		PIDS+=($!)
		NODE_PIDS[$i]=$!
		SOCKS+=("$d/mounter.sock")
	done
	for s in "${SOCKS[@]}"; do
		for _ in $(seq 1 100); do [[ -S $s ]] && break; sleep 0.1; done
		[[ -S $s ]] || die "a mounter did not start: $(cat "$(dirname "$s")/mounter.log")"
		if [[ $peers == 1 && -n $KUBECTL && ${LIAR:-0} != 1 && ${K8S_ROW:-0} == 1 ]]; then
			wait_members "$(dirname "$s")/mounter.log" "$n"
		fi
	done
}

# read_node SOCK [check]: mount the version on one node and read every
# file; with check, compare every file with the model's (no wrong byte).
read_node() {
	local out path
	out=$(curl -sf --unix-socket "$1" -X POST -d "{\"ref\":\"$REF\"}" http://mounter/v1/mount) || { log "mount failed on $1"; return 1; }
	path=$(printf '%s' "$out" | sed -n 's/.*"path":"\([^"]*\)".*/\1/p')
	if [[ ${2:-} == check ]]; then
		diff -r -q "$MODEL" "$path" >/dev/null || { log "wrong bytes on $1"; return 1; }
	else
		find "$path" -type f -exec cat {} + >/dev/null
	fi
}

# run N PEERS: one fleet start; sets RESULT to "seconds linkbytes cpu" (and
# LATE_BYTES after the largest fleet with the peer tier).
run() {
	local n=$1 peers=$2 tag=run-$1-$2 before t0 t1 s
	start_nodes "$n" "$peers" "$tag"
	before=$(link_bytes)
	t0=$(now)
	local jobs=()
	for s in "${SOCKS[@]}"; do read_node "$s" & jobs+=($!); done
	for j in "${jobs[@]}"; do wait "$j" || die "a node failed to read the version"; done
	t1=$(now)
	local cpu bytes
	cpu=$(cpu_of "${PIDS[@]}")
	sleep 0.5
	bytes=$(($(link_bytes) - before))
	RESULT="$(secs "$t0" "$t1") $bytes $cpu"
	if [[ $peers == 1 && $n == "${NODES##* }" ]]; then
		# A node that joins once the others finished.
		local d=$TMP/$tag/late port
		mkdir -p "$d/state" "$d/mounts"
		while :; do port=$((20000 + RANDOM % 40000)); port_free "$port" && break; done
		local addrs
		addrs=$(grep -ho -- '"listen":"[^"]*"' "$TMP/$tag"/node*/mounter.log | sed 's/"listen":"\(.*\)"/\1/' | paste -sd,)
		local pflags=(--peer-listen "127.0.0.99:$port" --peers "$addrs,127.0.0.99:$port" --peer-insecure)
		if [[ -n $KUBECTL && ${K8S_ROW:-0} == 1 ]]; then
			add_slice "bench-$tag-late" "$HOSTIP" "$port"
			pflags=(--peer-listen "$HOSTIP:$port" --peer-service kube-system/bdnvol-csi-peers --peer-tls-secret kube-system/bdnvol-csi-peer-ca)
		fi
		KUBECONFIG=$TMP/kube/kubeconfig "$BDNVOL" --cache-dir "$d/cache" csi mounter --mounter-socket "$d/mounter.sock" --state-dir "$d/state" \
			--mounts-dir "$d/mounts" --hosts-dir none --profile off --cache-size 4GiB \
			"${pflags[@]}" 2>"$d/mounter.log" &
		PIDS+=($!)
		for _ in $(seq 1 100); do [[ -S $d/mounter.sock ]] && break; sleep 0.1; done
		[[ -n $KUBECTL && ${K8S_ROW:-0} == 1 ]] && wait_members "$d/mounter.log" $((n + 1))
		before=$(link_bytes)
		read_node "$d/mounter.sock" || die "the late node failed"
		sleep 0.5
		LATE_BYTES=$(($(link_bytes) - before))
	fi
	stop_nodes
}

ROWS=${BENCH_ROWS:-fleet kill liar pull warm}
has_row() { [[ " $ROWS " == *" $1 "* ]]; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

if has_row fleet; then
printf '| nodes | peer tier | link bytes / version | time / one node | mounters CPU (user+sys) |\n|---|---|---|---|---|\n'
BASE=
for peers in ${BENCH_MODES:-1 0}; do
	for n in $NODES; do
		log "N=$n, peer tier $([[ $peers == 1 ]] && echo on || echo off)"
		K8S_ROW=1 run "$n" "$peers"
		read -r t b c <<<"$RESULT"
		[[ -z $BASE ]] && BASE=$t
		printf '| %s | %s | %s | %s (%s s) | %s s |\n' "$n" "$([[ $peers == 1 ]] && echo on || echo off)" \
			"$(awk -v b="$b" -v m="$MODEL_BYTES" 'BEGIN {printf "%.3f", b / m}')" \
			"$(awk -v t="$t" -v o="$BASE" 'BEGIN {printf "%.2f", t / o}')" "$t" "$c"
	done
done
printf '\nA node joining after the others finished (peer tier on): %s link bytes. Membership: %s.\n\n' "${LATE_BYTES:-?}" "$MEMBERSHIP"
fi

# run_kill N: N nodes read the version at once; the last node's mounter is
# killed (SIGKILL) once the link has carried half the version. The others
# must finish with every byte right. Sets RESULT "seconds linkbytes cpu".
run_kill() {
	local n=$1 tag=kill-$1 before t0 t1 s half j
	start_nodes "$n" 1 "$tag"
	before=$(link_bytes)
	half=$((before + MODEL_BYTES / 2))
	t0=$(now)
	local jobs=() victim=${NODE_PIDS[$n]}
	for s in "${SOCKS[@]:0:$((n - 1))}"; do read_node "$s" check & jobs+=($!); done
	read_node "${SOCKS[$((n - 1))]}" >/dev/null 2>&1 &
	local vjob=$!
	while (($(link_bytes) < half)); do sleep 0.1; done
	local cpu_victim
	cpu_victim=$(cpu_of "$victim")
	kill -KILL "$victim"
	for j in "${jobs[@]}"; do wait "$j" || die "a node failed to read the version right after an owner was killed"; done
	t1=$(now)
	wait "$vjob" 2>/dev/null || true
	local cpu
	cpu=$(awk -v a="$(cpu_of "${NODE_PIDS[@]:1:$((n - 1))}")" -v b="$cpu_victim" 'BEGIN {printf "%.1f", a + b}')
	sleep 0.5
	RESULT="$(secs "$t0" "$t1") $(($(link_bytes) - before)) $cpu"
	stop_nodes
}

# run_liar N: N nodes read the version at once; the last node's peers reach
# it through a proxy that flips a byte of every chunk it sends. Every node
# must read every byte right. Sets RESULT "seconds linkbytes cpu asked".
run_liar() {
	local n=$1 tag=liar-$1 before t0 t1 s j
	LIAR=1 start_nodes "$n" 1 "$tag"
	before=$(link_bytes)
	t0=$(now)
	local jobs=()
	for s in "${SOCKS[@]}"; do read_node "$s" check & jobs+=($!); done
	for j in "${jobs[@]}"; do wait "$j" || die "a node read wrong bytes (or failed) with a lying peer"; done
	t1=$(now)
	local cpu
	cpu=$(cpu_of "${NODE_PIDS[@]:1}")
	sleep 0.5
	RESULT="$(secs "$t0" "$t1") $(($(link_bytes) - before)) $cpu $(wc -l <"$TMP/$tag/liar.log")"
	stop_nodes
}

# run_pull N: N `bdnvol pull`s of the version at once, each with its own
# cache directory and peer address (--peer-linger 1s). Every tree must be
# the model's. Sets RESULT "seconds linkbytes cpu": seconds the slowest
# pull took (its own figure, without the linger).
run_pull() {
	local n=$1 tag=pull-$1 before i addrs=() all
	for i in $(seq 1 "$n"); do addrs+=("127.0.0.$((i + 1)):$(free_port)"); done
	all=$(IFS=,; echo "${addrs[*]}")
	mkdir -p "$TMP/$tag"
	before=$(link_bytes)
	local jobs=() flags=()
	for i in $(seq 1 "$n"); do
		local d=$TMP/$tag/node$i
		mkdir -p "$d"
		flags=()
		((n > 1)) && flags=(--peer-listen "${addrs[$((i - 1))]}" --peers "$all" --peer-insecure --peer-linger 1s)
		/usr/bin/time -f '%U %S' -o "$d/cpu" "$BDNVOL" --cache-dir "$d/cache" pull --json "${flags[@]}" "$REF" "$d/out" \
			>"$d/out.json" 2>"$d/pull.log" &
		jobs+=($!)
	done
	local j
	for j in "${jobs[@]}"; do wait "$j" || die "a pull failed: $(cat "$TMP/$tag"/node*/pull.log)"; done
	for i in $(seq 1 "$n"); do
		diff -r -q "$MODEL" "$TMP/$tag/node$i/out" >/dev/null || die "pull $i wrote wrong bytes"
	done
	sleep 0.5
	local t cpu
	t=$(cat "$TMP/$tag"/node*/out.json | sed -n 's/.*"seconds":\([0-9.]*\).*/\1/p' | sort -g | tail -1 | awk '{printf "%.2f", $1}')
	cpu=$(cat "$TMP/$tag"/node*/cpu | awk '{s += $1 + $2} END {printf "%.1f", s}')
	RESULT="$t $(($(link_bytes) - before)) $cpu"
	rm -rf "$TMP/$tag"
}

# run_warm N: N mounters whose --warm-list (absent at first, re-read every
# second) then names the version: they warm it at once through the peer
# tier. Sets RESULT "seconds linkbytes cpu": until every node is warm.
run_warm() {
	local n=$1 tag=warm-$1 before t0 t1 i
	mkdir -p "$TMP/$tag"
	NODE_FLAGS=(--warm-list "$TMP/$tag/warm-list" --warm-resolve-interval 1s)
	start_nodes "$n" 1 "$tag"
	NODE_FLAGS=()
	before=$(link_bytes)
	t0=$(now)
	printf '%s\n' "$REF" >"$TMP/$tag/warm-list"
	for i in $(seq 1 "$n"); do
		local st=$TMP/$tag/node$i/state/warm-status.json
		for _ in $(seq 1 6000); do
			grep -q '"state": *"warm"' "$st" 2>/dev/null && break
			grep -q '"state": *"error"' "$st" 2>/dev/null && die "node $i: warming failed: $(cat "$st")"
			sleep 0.1
		done
		grep -q '"state": *"warm"' "$st" 2>/dev/null || die "node $i never got warm: $(cat "$st" 2>/dev/null)"
	done
	t1=$(now)
	local cpu
	cpu=$(cpu_of "${NODE_PIDS[@]:1}")
	sleep 0.5
	RESULT="$(secs "$t0" "$t1") $(($(link_bytes) - before)) $cpu"
	stop_nodes
}

printf '| row (peer tier on) | nodes | link bytes / version | time (s) | client CPU (user+sys, s) | note |\n|---|---|---|---|---|---|\n'
for n in $NODES; do
	if has_row kill && ((n > 1)); then
		log "N=$n, an owner killed half-way"
		run_kill "$n"
		read -r t b c <<<"$RESULT"
		printf '| owner killed half-way | %s | %s | %s | %s | 1 of %s mounters (1/%s of the chunks) SIGKILLed at half the version; %s survivors read every byte right |\n' \
			"$n" "$(ratio "$b" "$MODEL_BYTES")" "$t" "$c" "$n" "$n" "$((n - 1))"
	fi
	if has_row liar && ((n > 1)); then
		log "N=$n, a lying peer"
		run_liar "$n"
		read -r t b c asked <<<"$RESULT"
		printf '| a peer serving wrong bytes | %s | %s | %s | %s | every node read every byte right; the liar was asked %s times in all |\n' \
			"$n" "$(ratio "$b" "$MODEL_BYTES")" "$t" "$c" "$asked"
	fi
	if has_row pull; then
		log "N=$n, bdnvol pull"
		run_pull "$n"
		read -r t b c <<<"$RESULT"
		printf '| `bdnvol pull` at once | %s | %s | %s | %s | %s |\n' "$n" "$(ratio "$b" "$MODEL_BYTES")" "$t" "$c" \
			"$( ((n > 1)) && echo "--peer-listen/--peers, each its own cache" || echo "one pull, no peer tier")"
	fi
	if has_row warm; then
		log "N=$n, warm-list rollout"
		run_warm "$n"
		read -r t b c <<<"$RESULT"
		printf '| warm-list rollout | %s | %s | %s | %s | the list names the version; time until every node is warm |\n' "$n" "$(ratio "$b" "$MODEL_BYTES")" "$t" "$c"
	fi
done
printf '\nLink: %s per request, %s/s shared; version %s bytes in %s shards. Load: %s\n' "$DELAY" "$RATE" "$MODEL_BYTES" "$SHARDS" "$(uptime | sed 's/.*load/load/')"
