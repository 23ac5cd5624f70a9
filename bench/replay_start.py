#!/usr/bin/env python3
# bench/replay_start.py DIR: in a directory bench/profile.sh kept
# (BENCH_KEEP=1), for each mount with the profile, the time from
# `mount --daemon` to its exit (ready) and to the replay's first chunk
# request (the first request of a profile chunk after the profile
# document's GET ended), from the linkproxy -log and mounts.log; and the
# requests that found the profile.
import sys,json,re,os
d=sys.argv[1]
import hashlib
prof=set(json.load(open(os.path.join(d,'profile.json')))['chunks'])
docd='sha256:'+hashlib.sha256(open(os.path.join(d,'profile.json'),'rb').read()).hexdigest()
reqs=[]
for l in open(os.path.join(d,'requests.log')):
    f=l.split()
    if len(f)<4 or not f[0][0].isdigit(): continue
    reqs.append((float(f[0]),float(f[1]),f[3]))
reqs.sort()
out=[]
for l in open(os.path.join(d,'mounts.log')):
    f=l.split()
    n,mode,t0,t1=f[0],f[1],int(f[2])/1e9,int(f[3])/1e9
    flags=' '.join(f[4:])
    if flags: continue
    docend=None; first=None; chain=[]
    for a,e,p in reqs:
        if a<t0: continue
        if docend is None:
            if not p.startswith('/v2/bdnvol/blobs/') or p.endswith(docd):
                chain.append((round((a-t0)*1000),round((e-t0)*1000),p.split('/')[-2][:4]+'/'+p.split('/')[-1][:12]))
            if p.endswith(docd): docend=e
            continue
        m=re.search(r'/blobs/(sha256:[0-9a-f]+)',p)
        if a>=docend and m and m.group(1) in prof:
            first=a; break
    print(f"mount{n} {mode}: ready {1000*(t1-t0):.0f} ms; replay's first chunk request {1000*(first-t0):.0f} ms after mount --daemon ({1000*(first-t1):+.0f} ms vs ready); lookup chain: {chain}")
