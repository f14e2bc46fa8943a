#!/usr/bin/env python3
"""Where a traced conversion's wall time goes at its two ends.

usage: QUANTD_PIPE_TRACE=1 trace_wall.py TRACE quantd convert ...

Runs the command with its stderr (the trace) into TRACE and prints its wall time split three
ways: before the trace's origin (the process starting, its arguments and checks), the traced
span (the backend's start to its close), and after it (the process's exit: the CUDA driver's
teardown and the release of pinned memory). The trace's "pipe-origin" line is the origin on
CLOCK_MONOTONIC, the clock time.monotonic() reads on Linux."""
import subprocess
import sys
import time

trace, cmd = sys.argv[1], sys.argv[2:]
t0 = time.monotonic()
with open(trace, "w") as f:
    p = subprocess.run(cmd, stderr=f, stdout=subprocess.DEVNULL)
t1 = time.monotonic()
origin, end = None, 0.0
for line in open(trace):
    if line.startswith("pipe-origin "):
        origin = float(line.split()[1])
    elif line.startswith("pipe "):
        end = max(end, float(line.split()[4]))
if origin is None:
    sys.exit("trace_wall: no pipe-origin line in %s (QUANTD_PIPE_TRACE unset, or the command failed: rc %d)"
             % (trace, p.returncode))
print("wall %.3f pre %.3f traced %.3f post %.3f rc %d" % (t1 - t0, origin - t0, end, t1 - origin - end, p.returncode))
sys.exit(p.returncode)
