#!/usr/bin/env python3
"""/healthz under connection floods alone: where a probe's time goes when nothing else loads
the daemon (docs/security.md, the soak's figures).

usage: flood_latency.py [--seconds 60] [--quantd bin/quantd]

The daemon (CPU backend, --max-connections 512) on the last core, this script on the others.
First 1,000 /healthz one after the other: the daemon's CPU time and minor page faults per
request. Then, for --seconds, a flood every ~3.7 s (1,024 idle connections opened as fast as
possible, held 1.5 s, closed) while a process of its own probes /healthz every 5 ms on a fresh
connection. Prints the daemon's CPU time to take in and to close a flood, and the probes'
latency (p50, p99, max) and refusals by phase: while a flood opens, while it holds its
connections, from its close to a second later, and the calm between floods."""
import argparse
import http.client
import multiprocessing
import os
import resource
import socket
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_ms_and_faults(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1e3 / os.sysconf("SC_CLK_TCK"), int(f[7])


def prober(port, stop, out):
    probes = []
    while not stop.is_set():
        t, t0 = time.time(), time.perf_counter()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            c.close()
            probes.append((t, (time.perf_counter() - t0) * 1e3, r.status))
        except OSError as e:
            probes.append((t, (time.perf_counter() - t0) * 1e3, repr(e)))
        time.sleep(0.005)
    out.send(probes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--quantd", default=os.path.join(ROOT, "bin", "quantd"))
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, cores[:-1])
    server = subprocess.Popen(["taskset", "-c", str(cores[-1]), a.quantd, "serve", "--listen", f"127.0.0.1:{port}",
                               "--backend", "cpu", "--conn-timeout", "3", "--max-connections", "512"],
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.01)
        time.sleep(0.5)
        cpu0, faults0 = cpu_ms_and_faults(server.pid)
        for _ in range(1000):
            c = http.client.HTTPConnection("127.0.0.1", port)
            c.request("GET", "/healthz")
            c.getresponse().read()
            c.close()
        time.sleep(0.5)
        cpu1, faults1 = cpu_ms_and_faults(server.pid)
        print(f"1,000 /healthz: daemon CPU {cpu1 - cpu0:.0f} ms, {faults1 - faults0} minor faults")

        out, into = multiprocessing.Pipe(duplex=False)
        stop = multiprocessing.Event()
        probe = multiprocessing.Process(target=prober, args=(port, stop, into))
        probe.start()
        floods, costs, end = [], [], time.time() + a.seconds
        while time.time() < end:
            time.sleep(1)
            c0 = cpu_ms_and_faults(server.pid)[0]
            t0 = time.time()
            socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(1024)]
            t1 = time.time()
            time.sleep(1.5)
            c1 = cpu_ms_and_faults(server.pid)[0]
            for s in socks:
                s.close()
            floods.append((t0, t1, time.time()))
            time.sleep(0.2)
            costs.append((c1 - c0, cpu_ms_and_faults(server.pid)[0] - c1))
        stop.set()
        probes = out.recv()
        probe.join()
    finally:
        server.terminate()
        server.wait()
    print(f"{len(floods)} floods: daemon CPU to take one in {statistics.median(c for c, _ in costs):.0f} ms, "
          f"to close it {statistics.median(c for _, c in costs):.0f} ms (median; the clock ticks by 10 ms)")
    phases = {"opening": lambda t: any(a <= t <= b for a, b, _ in floods),
              "held": lambda t: any(b < t <= c for a, b, c in floods),
              "closed +1 s": lambda t: any(c < t <= c + 1 for a, b, c in floods),
              "calm": lambda t: not any(a <= t <= c + 1 for a, b, c in floods)}
    for name, inside in phases.items():
        ok = [ms for t, ms, st in probes if inside(t) and st == 200]
        other = [st for t, ms, st in probes if inside(t) and st != 200]
        p99 = statistics.quantiles(ok, n=100)[98] if len(ok) > 100 else float("nan")
        print(f"{name:12s} {len(ok):5d} probes answered 200: p50 {statistics.median(ok) if ok else 0:6.2f} ms, "
              f"p99 {p99:6.2f} ms, max {max(ok) if ok else 0:6.2f} ms; {len(other)} not: {sorted(set(map(str, other)))}")


if __name__ == "__main__":
    main()
