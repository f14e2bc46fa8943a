#!/usr/bin/env python3
"""Sums a conversion's traces (QUANTD_PIPE_TRACE=1 QUANTD_GPU_TRACE=1 quantd convert ... 2> TRACE).

usage: trace_sum.py TRACE...

Per format: the GPU jobs' count, their summed H2D, kernel and D2H milliseconds (over every
lane) and input bytes. Per pipeline stage: its first start, its last end, and its busy time
summed over its threads (busy / span: how many threads it kept busy on average)."""
import collections
import sys

for fn in sys.argv[1:]:
    gpu = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0])
    pipe = collections.defaultdict(lambda: [1e9, 0.0, 0, 0.0, 0])
    for line in open(fn):
        p = line.split()
        if p and p[0] == "gpu" and len(p) >= 8:
            x = gpu[p[2]]
            x[0] += 1
            x[1] += float(p[4])
            x[2] += float(p[5])
            x[3] += float(p[6])
            x[4] += int(p[7])
        elif p and p[0] == "pipe" and len(p) >= 6:
            x = pipe[p[1]]
            t0, t1 = float(p[3]), float(p[4])
            x[0], x[1] = min(x[0], t0), max(x[1], t1)
            x[2] += 1
            x[3] += t1 - t0
            x[4] += int(p[5])
    print(fn)
    for k, x in gpu.items():
        print("  %-8s n %4d h2d %8.1f kernel %8.1f d2h %6.1f ms, %.2f GB in" % (k, x[0], x[1], x[2], x[3], x[4] / 1e9))
    for k, x in pipe.items():
        span = max(x[1] - x[0], 1e-9)
        print("  pipe %-10s from %.3f to %.3f s (%d spans), busy %.2f s (%.1f threads), %.2f GB"
              % (k, x[0], x[1], x[2], x[3], x[3] / span, x[4] / 1e9))
