# shellcheck shell=bash
# bench/lib.sh — helpers shared by bench.sh and mount.sh. Callers define
# log and die, and set BIN (tools), TMP (scratch) and REGISTRY (after
# install_tool registry ...); start_registry sets HOST and REG_PID.

# install_tool NAME MODULE@VERSION WANT VERSION-ARG: use $BIN/NAME, else
# $BENCH_TOOLS/NAME, else go install it into $BIN. WANT is a string that
# `NAME VERSION-ARG` prints for the right version.
install_tool() {
	local name=$1 pkg=$2 want=$3 varg=$4
	if [[ -x $BIN/$name ]] && "$BIN/$name" "$varg" 2>&1 | grep -qF -- "$want"; then
		return
	fi
	if [[ -n ${BENCH_TOOLS:-} && -x $BENCH_TOOLS/$name ]] && "$BENCH_TOOLS/$name" "$varg" 2>&1 | grep -qF -- "$want"; then
		log "using $BENCH_TOOLS/$name"
		cp "$BENCH_TOOLS/$name" "$BIN/$name"
		return
	fi
	log "installing $pkg into $BIN"
	(cd "$BIN" && GOBIN=$BIN GOFLAGS=-buildvcs=false go install "$pkg") || die "go install $pkg failed"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_registry() {
	local port
	for _ in $(seq 1 20); do
		port=$((20000 + RANDOM % 40000))
		port_free "$port" || continue
		cat >"$TMP/config.yml" <<-EOF
			version: 0.1
			log:
			  level: error
			  accesslog:
			    disabled: true
			storage:
			  filesystem:
			    rootdirectory: $TMP/registry
			  delete:
			    enabled: true
			  maintenance:
			    uploadpurging:
			      enabled: false
			http:
			  addr: 127.0.0.1:$port
			  secret: bdnvol-bench
		EOF
		OTEL_TRACES_EXPORTER=none OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none OTEL_SDK_DISABLED=true \
			"$REGISTRY" serve "$TMP/config.yml" >"$TMP/registry.log" 2>&1 &
		REG_PID=$!
		for _ in $(seq 1 100); do
			if ! kill -0 "$REG_PID" 2>/dev/null; then
				break
			fi
			if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
				HOST=127.0.0.1:$port
				log "registry on $HOST (pid $REG_PID)"
				return
			fi
			sleep 0.1
		done
		kill "$REG_PID" 2>/dev/null || true
		wait "$REG_PID" 2>/dev/null || true
		REG_PID=
	done
	cat "$TMP/registry.log" >&2 || true
	die "could not start the registry"
}

# settle [INPUT...]: before a measured run, write back what the previous run
# left dirty and, where we may (root; BENCH_DROP_CACHES=0 turns it off), drop
# the page cache and read the inputs in again. Without that, a run that
# writes while the page cache is full pays for reclaim in system time, and
# which tool does depends on the order of the runs (measured: one bdnvol pull
# of 1 GiB, 0.8 s system CPU with memory free, 6.1 s with it full).
settle() {
	sync
	if [[ ${BENCH_DROP_CACHES:-1} == 1 && -w /proc/sys/vm/drop_caches ]]; then
		echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true
		local f
		for f in "$@"; do
			if [[ -d $f ]]; then cat "$f"/* >/dev/null 2>&1 || true; elif [[ -e $f ]]; then cat "$f" >/dev/null; fi
		done
	fi
	sleep 1
}

# mid_tensor FILE: the largest tensor in the middle half of a safetensors
# file, as "header-length offset length" (bytes from the file's start).
mid_tensor() {
	python3 - "$1" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
offs = sorted(v["data_offsets"] for k, v in h.items() if k != "__metadata__")
mid = offs[len(offs) // 4: 3 * len(offs) // 4] or offs
b, e = max(mid, key=lambda o: o[1] - o[0])
print(8 + n, 8 + n + b, e - b)
PY
}
