#!/usr/bin/env python3
"""make bench-latency: request latency at fixed rates with a standard load generator (hey).

usage: bench_latency.py OUT.json [--backend cpu|cuda] [--seconds S] [--formats nvfp4,q8_0]

Starts `quantd serve` on loopback, then for each format sends 256x256 bf16 raw bodies to
/quantize (the answer: JSON) with hey, 10 connections, at 500, 1,000 and 2,000 requests/s
(hey -q is per connection) and without a rate limit (the saturation point), plus /healthz at
1,000/s for the floor of the HTTP path. For each run: achieved rate, p50/p90/p99 as hey saw
them, non-200 answers, and the server's own phases of the same requests (from its access log:
receiving the body, waiting in the queue, running, sending the answer). The table goes to
stdout; everything to OUT.json (bench/plot_latency.py draws it)."""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))
HEY = os.environ.get("HEY") or shutil.which("hey") or os.path.join(ROOT, "build", "tools", "usr", "bin", "hey")
CONNECTIONS = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body(path):
    """256x256 bf16 of N(0, 0.02) (a weight's scale), deterministic."""
    state, out = 12345, bytearray()
    import math
    import struct
    for _ in range(256 * 256 // 2):
        vals = []
        for _ in range(2):  # Box-Muller from a 64-bit LCG
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            u1 = ((state >> 11) + 1) / 2**53
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            u2 = (state >> 11) / 2**53
            vals.append(0.02 * math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2))
        for v in vals:
            out += struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0] >> 16)[:2]
    with open(path, "wb") as f:
        f.write(out)


def hey(url, seconds, rate, data=None):
    cmd = [HEY, "-z", f"{seconds}s", "-c", str(CONNECTIONS)]
    if rate:
        cmd += ["-q", str(rate // CONNECTIONS)]
    if data:
        cmd += ["-m", "POST", "-T", "application/octet-stream", "-D", data]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
    pct = {int(p): float(v) * 1e3 for p, v in re.findall(r"(\d+)% in ([\d.]+) secs", out)}
    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return {"rps": rps, "p50_ms": pct.get(50), "p90_ms": pct.get(90), "p99_ms": pct.get(99),
            "ok": codes.get(200, 0), "not_ok": sum(n for c, n in codes.items() if c != 200)}


def phases(log, start):
    """p50/p99 of each phase over the log lines from byte offset start on."""
    with open(log) as f:
        f.seek(start)
        lines = [json.loads(x) for x in f if x.startswith('{"ts"')]
    rows = [x["phases_ms"] for x in lines if "phases_ms" in x]
    out = {}
    for k in ("recv", "queue", "run", "send"):
        v = sorted(r[k] for r in rows)
        if v:
            out[k] = {"p50": v[len(v) // 2], "p99": v[min(len(v) - 1, int(len(v) * 0.99))]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--formats", default="nvfp4,q8_0")
    a = ap.parse_args()
    if not os.path.exists(HEY):
        sys.exit(f"no hey at {HEY} (make bench-latency fetches Debian's package into build/tools)")
    work = tempfile.mkdtemp(prefix="quantd-latency-")
    data, log = os.path.join(work, "w.bin"), os.path.join(work, "serve.log")
    body(data)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    logf = open(log, "w")
    server = subprocess.Popen([QUANTD, "serve", "--listen", f"127.0.0.1:{port}", "--backend", a.backend],
                              stderr=logf)
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.01)
        runs = []
        plan = [("healthz", 1000)] + [(f, r) for f in a.formats.split(",") for r in (500, 1000, 2000, 0)]
        for what, rate in plan:
            logf.flush()
            start = os.path.getsize(log)
            if what == "healthz":
                r = hey(f"{base}/healthz", a.seconds, rate)
            else:
                url = f"{base}/quantize?fmt={what}&dtype=bf16&shape=256,256"
                hey(url, 1, rate, data)  # warm-up
                start = os.path.getsize(log)
                r = hey(url, a.seconds, rate, data)
            time.sleep(0.2)
            r.update({"what": what, "rate": rate or "max", "phases": phases(log, start)})
            runs.append(r)
            ph = r["phases"]
            cols = " | ".join(f"{ph[k]['p50']:.2f} / {ph[k]['p99']:.2f}" if k in ph else "-"
                              for k in ("recv", "queue", "run", "send"))
            print(f"| {what} | {r['rate']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
                  f"{r['p99_ms']:.2f} | {r['not_ok']} | {cols} |", flush=True)
    finally:
        server.terminate()
        server.wait()
        logf.close()
    with open(a.out, "w") as f:
        json.dump({"backend": a.backend, "cores": os.cpu_count(), "seconds": a.seconds,
                   "connections": CONNECTIONS, "body": "256x256 bf16 raw -> JSON", "runs": runs}, f, indent=1)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
