#!/usr/bin/env python3
"""make soak: quantd serve under twice its capacity, hostile clients and probes, for a bounded time.
The daemon runs on the upper half of the cores, the clients on the lower half.

usage: soak.py [--seconds 600] [--json OUT] [--quantd bin/quantd]

One daemon on loopback (CPU backend, a small queue so that overload shows, --conn-timeout 3).
First the capacity of a mix of requests is measured (closed loop, 15 s); then, for --seconds:
- the mix at twice that rate, open loop (a request leaves on its schedule whether or not the
  last one came back): formats of every family, 64x64 to 1024x1024, f32/f16/bf16, raw, JSON
  (base64) and safetensors bodies, JSON and safetensors answers, synchronous and /jobs;
- async jobs are followed to their end: each accepted job's result is fetched, or it is
  cancelled with DELETE (a quarter of them, some while queued);
- clients that go away: half a body then close, or the whole request then close unread;
- slow clients: headers trickled a byte at a time, a body stalled after its first bytes, a
  client that never reads a 16 MB answer; each must be cut off by the conn timeout;
- /healthz every 20 ms on a fresh connection.
Checks (the exit status is 1 when one fails): every answer is 200, or 503 with Retry-After
(overload), or the 404/409 a job's life explains; every accepted job is answered or cancelled;
/healthz p99 < 10 ms; RSS after warm-up stays flat (the last quarter's median within 5 % +
16 MiB of the second quarter's); open fds and threads after the run equal those before it;
slow clients are cut off within the timeout (+ 2 s); SIGTERM at the end exits 0."""
import argparse
import base64
import http.client
import json
import multiprocessing
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONN_TIMEOUT = 3
FORMATS = ["nf4", "fp4", "q4_0", "q8_0", "q5_1", "awq", "nvfp4", "mxfp4", "mxfp8_e4m3", "int8", "uint8"]
SHAPES = [(256, 256), (512, 1024), (1024, 1024), (1024, 2048)]  # awq takes groups of 128 rows


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []
        self.accepted, self.answered, self.cancelled = set(), set(), set()

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, msg):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(msg)


def tensor(shape, dtype, rng):
    n = shape[0] * shape[1]
    vals = [rng.gauss(0.0, 0.02) for _ in range(n)]
    raw = struct.pack(f"<{n}f", *vals)
    if dtype == "f32":
        return raw
    if dtype == "bf16":
        return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    return struct.pack(f"<{n}e", *vals)


def safetensors(data, dtype, shape):
    st = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[dtype]
    head = json.dumps({"x": {"dtype": st, "shape": list(shape), "data_offsets": [0, len(data)]}}).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


class Mix:
    """Requests built once: (route, query, content type, body). /quantize takes raw and JSON
    bodies (the format goes in the query); /dequantize takes the safetensors answers quantd
    gave for each format at the start."""

    def __init__(self, seed, port):
        rng = random.Random(seed)
        self.bodies, self.packed = [], []
        for shape in SHAPES:
            for dtype in ("f32", "f16", "bf16"):
                data = tensor(shape, dtype, rng)
                self.bodies.append((f"dtype={dtype}&shape={shape[0]},{shape[1]}", "application/octet-stream", data))
                self.bodies.append(("", "application/json", json.dumps(
                    {"dtype": dtype, "shape": list(shape), "data": base64.b64encode(data).decode()}).encode()))
        for fmt in FORMATS:
            for q, ct, body in self.bodies[:6]:  # 256x256, raw
                if ct != "application/octet-stream":
                    continue
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                status, _, st = request(c, "POST", f"/quantize?fmt={fmt}&{q}", body,
                                        {"Content-Type": ct, "Accept": "application/octet-stream"})
                c.close()
                if status != 200:
                    raise SystemExit(f"preparing /dequantize bodies: {fmt} {q} -> {status}")
                self.packed.append(st)
        self.rng = rng

    def pick(self):
        if self.rng.random() < 0.2:
            return "/dequantize", "", "application/octet-stream", self.packed[self.rng.randrange(len(self.packed))]
        q, ct, body = self.bodies[self.rng.randrange(len(self.bodies))]
        fmt = FORMATS[self.rng.randrange(len(FORMATS))]
        return "/quantize", (f"fmt={fmt}&{q}" if q else f"fmt={fmt}"), ct, body


def request(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    return r.status, r.getheader("Retry-After"), r.read()


def sync_call(port, mix, stats, rng):
    route, q, ct, body = mix.pick()
    accept = rng.choice(["application/json", "application/octet-stream"])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        status, retry, data = request(conn, "POST", route + ("?" + q if q else ""), body,
                                      {"Content-Type": ct, "Accept": accept})
        stats.count(f"sync {status}")
        if status == 503 and not retry:
            stats.fail("503 without Retry-After")
        elif status == 200 and accept == "application/json" and not data.startswith(b"{"):
            stats.fail("a JSON answer that is not JSON")
        elif status not in (200, 503):
            stats.fail(f"sync {route}?{q[:60]} -> {status} {data[:200]!r}")
    except Exception as e:  # noqa: BLE001 - any transport failure is a finding
        stats.fail(f"sync transport: {e!r}")
    finally:
        conn.close()


def async_call(port, mix, stats, rng):
    route, q, ct, body = mix.pick()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        status, retry, data = request(conn, "POST", f"/jobs?op={route[1:]}" + ("&" + q if q else ""), body,
                                      {"Content-Type": ct})
        stats.count(f"async submit {status}")
        if status == 503:
            if not retry:
                stats.fail("503 without Retry-After")
            return
        if status != 202:
            stats.fail(f"async submit -> {status} {data[:200]!r}")
            return
        loc = json.loads(data)["location"]
        with stats.lock:
            stats.accepted.add(loc)
        if rng.random() < 0.25:  # cancel it, perhaps while it waits
            time.sleep(rng.random() * 0.05)
            status, _, _ = request(conn, "DELETE", loc)
            if status == 204:
                with stats.lock:
                    stats.cancelled.add(loc)
            else:
                stats.fail(f"DELETE {loc} -> {status}")
            return
        deadline = time.time() + 300
        while time.time() < deadline:
            status, _, data = request(conn, "GET", loc + "/result")
            if status == 409:
                time.sleep(0.02)
                continue
            stats.count(f"async result {status}")
            if status in (200, 503):  # a job's answer is the synchronous call's, a 503 included
                with stats.lock:
                    stats.answered.add(loc)
                request(conn, "DELETE", loc)
            else:
                stats.fail(f"result {loc} -> {status} {data[:200]!r}")
            return
        stats.fail(f"{loc} never finished")
    except Exception as e:  # noqa: BLE001
        stats.fail(f"async transport: {e!r}")
    finally:
        conn.close()


def walk_away(port, mix, stats, rng):
    route, q, ct, body = mix.pick()
    head = (f"POST {route}?{q} HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            if rng.random() < 0.5:
                s.sendall(head + body[: len(body) // 2])
            else:
                s.sendall(head + body)
        stats.count("walked away")
    except OSError as e:
        stats.fail(f"walk-away transport: {e!r}")


def slow_client(port, stats, kind):
    """Returns the seconds until the server closed the connection."""
    t0 = time.time()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CONN_TIMEOUT * 4) as s:
            if kind in ("trickled headers", "trickled body"):
                text = (b"POST /quantize?fmt=q8_0&dtype=f32&shape=1,32 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 500
                        if kind == "trickled headers" else b"x" * 128)
                if kind == "trickled body":
                    s.sendall(b"POST /quantize?fmt=q8_0&dtype=f32&shape=1,32 HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Type: application/octet-stream\r\nContent-Length: 128\r\n\r\n")
                for byte in text:  # a byte every 0.5 s: never idle for the timeout
                    try:
                        s.sendall(bytes([byte]))
                    except OSError:
                        break
                    time.sleep(0.5)
                    if time.time() - t0 > CONN_TIMEOUT * 4:
                        break
            elif kind == "stalled body":
                s.sendall(b"POST /quantize?fmt=q8_0&dtype=f32&shape=1,32 HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/octet-stream\r\nContent-Length: 128\r\n\r\nabc")
            else:  # asks for a 5.6 MB answer (2048x2048 f32 to q8_0, JSON) and never reads it
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                body = struct.pack("<4f", 0.01, -0.02, 0.03, -0.04) * (2048 * 2048 // 4)
                s.sendall(b"POST /quantize?fmt=q8_0&dtype=f32&shape=2048,2048 HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/octet-stream\r\n"
                          + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            # wait for the server to close: recv returns b"" (or a reset)
            s.settimeout(CONN_TIMEOUT * 4)
            while True:
                if kind == "unread answer":
                    time.sleep(CONN_TIMEOUT * 2)  # never read while the timeout runs
                    kind = "drain"
                chunk = s.recv(65536)
                if not chunk:
                    break
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        stats.fail(f"slow client ({kind}) still connected after {time.time() - t0:.1f} s")
    return time.time() - t0


def prober(port, stop, out):
    """/healthz every 20 ms on a fresh connection, in a process of its own (this one's GIL
    would add its own waits to the latency), ahead of the generator's threads where the system
    allows it: sends back the latencies (ms) and failures."""
    try:
        os.nice(-10)
    except OSError:
        pass
    lat, bad = [], []
    while not stop.is_set():
        t = time.perf_counter()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz")
            r = c.getresponse()
            r.read()
            c.close()
            lat.append((time.perf_counter() - t) * 1e3)
            if r.status != 200:
                bad.append(f"/healthz -> {r.status}")
        except Exception as e:  # noqa: BLE001
            bad.append(f"/healthz transport: {e!r}")
        time.sleep(0.02)
    out.send((lat, bad[:20]))


def proc_stat(pid):
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    st = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        st[k] = v.strip()
    return {"rss_mb": int(st["VmRSS"].split()[0]) / 1024, "threads": int(st["Threads"]), "fds": fds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--json")
    ap.add_argument("--quantd", default=os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd")))
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.environ.get("SOAK_LOG", os.devnull), "w")
    # the daemon and the load generator on separate cores: otherwise the generator's threads,
    # as busy as the daemon at twice its capacity, would be what /healthz waits behind
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    daemon_cores, client_cores = cores[half:] or cores, cores[:half]
    os.sched_setaffinity(0, client_cores)
    server = subprocess.Popen(["taskset", "-c", ",".join(map(str, daemon_cores)), a.quantd, "serve", "--listen", f"127.0.0.1:{port}", "--backend", "cpu",
                               "--queue-depth", "8", "--conn-timeout", str(CONN_TIMEOUT), "--max-jobs", "256",
                               "--result-ttl", "60"], stderr=log)
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.01)
    time.sleep(0.3)
    before = proc_stat(server.pid)
    print(f"# quantd pid {server.pid} port {port} on cores {daemon_cores}, clients on {client_cores}; "
          f"at rest: {before}", flush=True)
    mix = Mix(1, port)
    stats = Stats()

    # capacity: closed loop, as many clients as cores x 2, 15 s
    done, stop = [0], time.time() + 15
    def closed(seed):
        rng = random.Random(seed)
        while time.time() < stop:
            sync_call(port, mix, stats, rng)
            done[0] += 1
    ts = [threading.Thread(target=closed, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    capacity = done[0] / 15
    rate = 2 * capacity
    print(f"# capacity of the mix: {capacity:.1f} req/s; soaking at {rate:.1f} req/s for {a.seconds} s", flush=True)

    running = [True]
    samples, health = [], []
    threads = []

    def sampler():
        t0 = time.time()
        while running[0]:
            st = proc_stat(server.pid)
            st["t"] = time.time() - t0
            samples.append(st)
            time.sleep(2)

    probe_stop = multiprocessing.Event()
    probe_out, probe_in = multiprocessing.Pipe(duplex=False)
    probe = multiprocessing.Process(target=prober, args=(port, probe_stop, probe_in), daemon=True)
    probe.start()

    slow_times = []
    def slow_loop():
        kinds = ["trickled headers", "trickled body", "stalled body", "unread answer"]
        # when the server should have let go: headers by the timeout + 1 s (+ the watchdog's
        # 0.25 s tick), a body once it averages under 8 KiB/s past the timeout, a stalled or
        # unread connection after the timeout (this client sleeps 2 x the timeout before
        # looking at an unread one); 1.5 s of slack for a busy host
        limit = {"trickled headers": CONN_TIMEOUT + 1.25, "trickled body": CONN_TIMEOUT + 0.5,
                 "stalled body": CONN_TIMEOUT, "unread answer": CONN_TIMEOUT * 2}
        i = 0
        while running[0]:
            kind = kinds[i % len(kinds)]
            took = slow_client(port, stats, kind)
            slow_times.append((kind, took))
            if took > limit[kind] + 1.5:
                stats.fail(f"slow client ({kind}) held {took:.1f} s")
            i += 1

    for fn in (sampler, slow_loop):
        t = threading.Thread(target=fn, daemon=True)
        t.start()
        threads.append(t)

    # open loop: a dispatcher starts each request on its schedule in a thread of its own
    rng = random.Random(7)
    t0 = time.time()
    next_at = t0
    inflight = []
    while time.time() - t0 < a.seconds:
        now = time.time()
        if now < next_at:
            time.sleep(min(next_at - now, 0.01))
            continue
        next_at += rng.expovariate(rate)
        r = rng.random()
        fn = sync_call if r < 0.6 else async_call if r < 0.9 else walk_away
        th = threading.Thread(target=fn, args=(port, mix, stats, random.Random(rng.random())), daemon=True)
        th.start()
        inflight.append(th)
        if len(inflight) > 512:
            inflight = [x for x in inflight if x.is_alive()]
    for th in inflight:
        th.join(timeout=600)
    running[0] = False
    probe_stop.set()
    health, probe_failures = probe_out.recv()
    probe.join(timeout=10)
    for f in probe_failures:
        stats.fail(f)
    for t in threads:
        t.join(timeout=CONN_TIMEOUT * 6)
    time.sleep(CONN_TIMEOUT + 1)  # connections of walked-away clients time out
    after = proc_stat(server.pid)
    server.send_signal(15)
    rc = server.wait(timeout=120)

    # verdicts
    lost = stats.accepted - stats.answered - stats.cancelled
    if lost:
        stats.fail(f"{len(lost)} accepted jobs neither answered nor cancelled, e.g. {sorted(lost)[:3]}")
    hp99 = statistics.quantiles(health, n=100)[98] if len(health) > 100 else float("nan")
    if not hp99 < 10:
        stats.fail(f"/healthz p99 {hp99:.2f} ms (limit 10)")
    rss = [s["rss_mb"] for s in samples]
    q = len(rss) // 4
    flat = None
    if q >= 2:
        second, last = statistics.median(rss[q:2 * q]), statistics.median(rss[3 * q:])
        flat = (second, last)
        if last > second * 1.05 + 16:
            stats.fail(f"RSS grew: median {second:.0f} MB in the second quarter, {last:.0f} MB in the last")
    if after["fds"] != before["fds"]:
        stats.fail(f"open fds {before['fds']} before, {after['fds']} after")
    if after["threads"] != before["threads"]:
        stats.fail(f"threads {before['threads']} before, {after['threads']} after")
    if rc != 0:
        stats.fail(f"SIGTERM: exit status {rc}")
    if not stats.counts.get("sync 503", 0) + stats.counts.get("async submit 503", 0):
        stats.fail("no 503 at twice the capacity: the overload never showed")
    result = {"seconds": a.seconds, "capacity_rps": capacity, "rate_rps": rate, "counts": stats.counts,
              "jobs": {"accepted": len(stats.accepted), "answered": len(stats.answered),
                       "cancelled": len(stats.cancelled), "lost": len(lost)},
              "healthz_ms": {"n": len(health), "p50": statistics.median(health) if health else None, "p99": hp99,
                             "max": max(health) if health else None},
              "rss_mb": {"at_rest": before["rss_mb"], "max": max(rss) if rss else None,
                         "second_quarter_median": flat[0] if flat else None,
                         "last_quarter_median": flat[1] if flat else None,
                         # one sample in ten, to see whether it levels off
                         "series": [round(v, 1) for v in rss[::10]]},
              "fds": [before["fds"], after["fds"]], "threads": [before["threads"], after["threads"]],
              "slow_clients": {k: [round(t, 2) for kk, t in slow_times if kk == k] for k in
                               ("trickled headers", "trickled body", "stalled body", "unread answer")},
              "exit_status": rc, "failures": stats.failures}
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if stats.failures else 0)


if __name__ == "__main__":
    main()
