#!/usr/bin/env python3
# bench/waits.py DIR: in a directory bench/profile.sh kept (BENCH_KEEP=1),
# for each load the loader traced (trace-local: the pulled copy; traceN: a
# mount, with mounts.log's start and flags), how long its tensor reads took
# in all against its span from the mount's start, its longest reads (when,
# from the start), and the read time in each second: where a load waited
# for the link and where it only paid for its pauses.
import glob
import os
import sys

d = sys.argv[1]
mounts = {}
for line in open(os.path.join(d, 'mounts.log')):
    f = line.split()
    mounts[f[0]] = (int(f[2]), int(f[3]), f[1], ' '.join(f[4:]))
for p in sorted(glob.glob(os.path.join(d, 'trace*'))):
    rows = [line.split() for line in open(p)]
    if not rows:
        continue
    n = os.path.basename(p)[len('trace'):]
    t0, label = int(rows[0][3]), 'pulled copy'
    if n in mounts:
        t0, ready, mode, flags = mounts[n]
        label = f"mount{n} {mode} {flags or '(profile)'}, ready {(ready - t0) / 1e9:.2f} s"
    reads = [(int(r[4]) - int(r[3])) / 1e9 for r in rows]
    size = sum(int(r[2]) for r in rows)
    print(f"{label}: {len(rows)} tensors, {size / 1e9:.2f} GB; reads {sum(reads):.2f} s; "
          f"first read at {(int(rows[0][3]) - t0) / 1e9:.2f} s, last done at {(int(rows[-1][4]) - t0) / 1e9:.2f} s")
    longest = sorted(sorted(range(len(rows)), key=lambda i: -reads[i])[:6])
    print('  longest:', ', '.join(
        f"#{i} {int(rows[i][2]) >> 20} MiB {reads[i] * 1000:.0f} ms at {(int(rows[i][3]) - t0) / 1e9:.2f} s" for i in longest))
    per = {}
    for r, x in zip(rows, reads):
        s = int((int(r[3]) - t0) / 1e9)
        per[s] = per.get(s, 0) + x
    print('  read seconds in each second:', ' '.join(f"{k}:{v:.2f}" for k, v in sorted(per.items())))

# The link: for each mount (and the pull), its requests (from its start to the next
# mount's), when the last one ended, and by each second the bytes fetched
# so far and the mean number of requests in flight (Jobs is the most).
reqs = []
for line in open(os.path.join(d, 'requests.log')):
    f = line.split()
    if len(f) < 4 or not f[0][0].isdigit():
        continue
    size = next((int(x[len('bytes='):]) for x in f if x.startswith('bytes=')), 0)
    reqs.append((float(f[0]), float(f[1]), size))
starts = sorted((t0 / 1e9, n) for n, (t0, _, _, _) in mounts.items())
for i, (t0, n) in enumerate(starts):
    t1 = starts[i + 1][0] if i + 1 < len(starts) else float('inf')
    rs = [r for r in reqs if t0 <= r[0] < t1]
    if not rs:
        continue
    end = max(r[1] for r in rs)
    cols = []
    for s in range(int(end - t0) + 1):
        done = sum(r[2] for r in rs if r[1] - t0 < s + 1)
        busy = sum(max(0.0, min(r[1], t0 + s + 1) - max(r[0], t0 + s)) for r in rs)
        cols.append(f"{s}:{done / 1e6:.0f}MB/{busy:.1f}")
    print(f"{'' if n == 'pull' else 'mount'}{n} link: {len(rs)} requests, {sum(r[2] for r in rs) / 1e9:.2f} GB, last ended at {end - t0:.2f} s; "
          f"by second, MB fetched/requests in flight: {' '.join(cols)}")
