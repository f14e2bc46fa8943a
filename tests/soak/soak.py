#!/usr/bin/env python3
"""make soak: quantd serve under twice its capacity, hostile clients and probes, for a bounded time.
The daemon runs on the upper half of the cores, the clients on the lower half.

usage: soak.py [--seconds 600] [--json OUT] [--quantd bin/quantd] [--preload LIB]   (make soak SOAK_SECONDS=N)

One daemon on loopback (CPU backend, a small queue so that overload shows, --conn-timeout 3,
--max-connections 512, --max-body-bytes 64 MiB, --max-convert-bytes 16 MiB,
--max-inflight-bytes 256 MiB, its spool files in a TMPDIR of its own). First the capacity of a mix of requests is measured (closed loop, 15 s);
then, for --seconds:
- the mix at twice that rate, open loop (a request leaves on its schedule whether or not the
  last one came back): formats of every family, 64x64 to 1024x1024, f32/f16/bf16, raw, JSON
  (base64) and safetensors bodies, JSON and safetensors answers, synchronous and /jobs, and
  small models to POST /convert;
- async jobs are followed to their end: each accepted job's result is fetched, or it is
  cancelled with DELETE (a quarter of them, some while queued);
- clients that go away: half a body then close, or the whole request then close unread, to
  /quantize and to /convert (whose spool file must go);
- slow clients: headers trickled a byte at a time, a body stalled after its first bytes, a
  client that never reads a 16 MB answer; each must be cut off by the conn timeout;
- hostile requests, one after the other: 300 KiB of headers (a JSON 431), a Content-Length of
  10^14 with Expect: 100-continue (413 at once, no 100 Continue), an endless chunked body to
  /quantize and to /convert (413 once past the limit);
- connection floods: every 20 s, twice --max-connections idle connections held 1.5 s (those
  past the limit get a JSON 503 too_many_connections), then closed;
- /healthz every 20 ms on a fresh connection, from a process of its own (past the limit, during
  a flood, the acceptor itself answers it; a probe refused all the same is counted apart).
A wedge (no 200 from /healthz for 10 s) stops the run at once: the daemon is killed and the
verdict says so. Checks (the exit status is 1 when one fails): every answer is 200, or 503 with
Retry-After (overload, or a connection past the limit), or the 404/409 a job's life explains;
every hostile request gets its JSON error; every accepted job is answered or cancelled;
/healthz p99 < 10 ms (reported apart during floods and between them); RSS never above
RSS_LIMIT_MB; no leak: the live heap (/metrics quantd_heap_in_use_bytes) with the daemon idle
after the soak within LEAK_MB of what it was idle after the capacity run; RSS levels off (the
last quarter's median within 5 % + 16 MiB of the third quarter's); the daemon serves at the end (/healthz
and a /quantize); open fds and threads after the run equal those before it; slow clients are
cut off within the timeout (+ 2 s); SIGTERM at the end exits 0 within 30 s; no spool or
temporary file is left in the daemon's TMPDIR. The last line printed is the verdict:
"VERDICT: PASS ..." or "VERDICT: FAIL: reason; reason ..."."""
import argparse
import base64
import http.client
import json
import multiprocessing
import os
import random
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONN_TIMEOUT = 3
MAX_CONNECTIONS = 512           # --max-connections; a flood opens twice as many
MAX_BODY = 64 << 20             # --max-body-bytes: over the mix's largest body (11 MB of JSON)
MAX_CONVERT = 16 << 20          # --max-convert-bytes
MAX_INFLIGHT = 256 << 20        # --max-inflight-bytes: what the RSS bound is made of, set here
                                # (the default, a quarter of the machine's memory, differs by host)
FLOOD_EVERY_S = 20
WEDGE_S = 10                    # /healthz without a 200 this long: wedged
# What the daemon may hold at most under this soak: the bodies in flight (MAX_INFLIGHT), the
# answers of the queue of 8 and its workers (up to 11 MB each), libmicrohttpd's 256 KiB buffer
# of each of 512 connections (128 MiB) and the free memory glibc keeps in its two arenas
# (up to the 64 MiB trim threshold at the top of each)
RSS_LIMIT_MB = 640
LEAK_MB = 8                     # live heap the soak may leave over what the capacity run left
HEALTHZ_P99_MS = 10
MODEL = os.path.join(ROOT, "tests", "checkpoint", "fuzz_seeds", "small.gguf")  # a GGUF for /convert
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

    def fail(self, msg, first=False):
        """Keeps the first 50 findings; one that decides the verdict by itself (a wedge, a
        daemon that does not stop) goes first, whatever came before."""
        with self.lock:
            if first:
                self.failures.insert(0, msg)
            elif len(self.failures) < 50:
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
        self.model = open(MODEL, "rb").read()
        self.rng = rng

    def pick(self, convert=True):
        if convert and self.rng.random() < 0.03:
            return "/convert", "fmt=q8_0", "application/octet-stream", self.model
        if self.rng.random() < 0.2:
            return "/dequantize", "", "application/octet-stream", self.packed[self.rng.randrange(len(self.packed))]
        q, ct, body = self.bodies[self.rng.randrange(len(self.bodies))]
        fmt = FORMATS[self.rng.randrange(len(FORMATS))]
        return "/quantize", (f"fmt={fmt}&{q}" if q else f"fmt={fmt}"), ct, body


class Refused(Exception):
    """The connection was past --max-connections: answered 503 at accept and closed."""


def refused_at_accept(conn):
    """After a send failed: whether what the server sent first was its 503 for a connection
    past the limit (it answers at accept and closes; a client still sending meets the close)."""
    try:
        conn.sock.settimeout(1)
        return json_error(conn.sock.recv(65536), 503) == "too_many_connections"
    except (OSError, AttributeError):
        return False


def request(conn, method, path, body=None, headers=None):
    try:
        conn.request(method, path, body=body, headers=headers or {})
    except (BrokenPipeError, ConnectionResetError):
        if refused_at_accept(conn):
            raise Refused() from None
        raise
    r = conn.getresponse()
    return r.status, r.getheader("Retry-After"), r.read()


def sync_call(port, mix, stats, rng):
    route, q, ct, body = mix.pick()
    accept = "application/octet-stream" if route == "/convert" else rng.choice(["application/json", "application/octet-stream"])
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
    except Refused:
        stats.count("refused at the connection limit")
    except Exception as e:  # noqa: BLE001 - any transport failure is a finding
        stats.fail(f"sync transport: {e!r}")
    finally:
        conn.close()


def async_call(port, mix, stats, rng):
    route, q, ct, body = mix.pick(convert=False)
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
    except Refused:
        stats.count("refused at the connection limit")
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
            try:
                if rng.random() < 0.5:
                    s.sendall(head + body[: len(body) // 2])
                else:
                    s.sendall(head + body)
            except (BrokenPipeError, ConnectionResetError):
                s.settimeout(1)
                if json_error(s.recv(65536), 503) != "too_many_connections":
                    raise
                stats.count("refused at the connection limit")
                return
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


def prober(port, stop, wedged, out):
    """/healthz every 20 ms on a fresh connection, in a process of its own (this one's GIL
    would add its own waits to the latency), ahead of the generator's threads where the system
    allows it: sends back the latencies (ms), the refusals for the connection limit (a flood
    is on) and failures; each latency with the time it was taken. No 200 for WEDGE_S seconds sets `wedged` and ends the probe."""
    try:
        os.nice(-10)
    except OSError:
        pass
    lat, bad, refused = [], [], 0
    last_ok = time.time()
    while not stop.is_set():
        t = time.perf_counter()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz")
            r = c.getresponse()
            body = r.read()
            c.close()
            if r.status == 200:
                lat.append((time.time(), (time.perf_counter() - t) * 1e3))
                last_ok = time.time()
            elif r.status == 503 and b"too_many_connections" in body and r.getheader("Retry-After"):
                refused += 1
            else:
                bad.append(f"/healthz -> {r.status} {body[:120]!r}")
        except Exception as e:  # noqa: BLE001
            bad.append(f"/healthz transport: {e!r}")
        if time.time() - last_ok > WEDGE_S:
            wedged.set()
            break
        time.sleep(0.02)
    out.send((lat, refused, bad[:20]))


def read_until_closed(s, limit=1 << 20):
    """What the server sends until it closes the connection (or 10 s pass)."""
    s.settimeout(10)
    data = b""
    try:
        while len(data) < limit:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return data


def json_error(answer, status):
    """The error code of a JSON error answer with this status, or None."""
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 %d " % status) or b"Content-Type: application/json" not in head:
        return None
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def hostile(port, stats, kind, model):
    """One hostile request; its JSON error is checked (or the 503 of a connection past the limit,
    when a flood is on). Counts and fails."""
    t0 = time.time()
    chunk = b"%x\r\n" % (1 << 20) + (model * ((1 << 20) // len(model) + 1))[:1 << 20] + b"\r\n"
    if kind == "headers over the buffer":
        head, want, code = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (300 << 10) + b"\r\n\r\n", 431, \
            "headers_too_large"
    elif kind == "content-length 10^14":
        head, want, code = (b"POST /quantize?fmt=q8_0&dtype=f32&shape=32 HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Type: application/octet-stream\r\nContent-Length: 100000000000000\r\n"
                            b"Expect: 100-continue\r\n\r\n"), 413, "body_too_large"
    else:  # an endless chunked body, to /quantize or to /convert
        path = b"/convert?fmt=q8_0" if kind == "endless chunked /convert" else b"/quantize?fmt=q8_0&dtype=f32&shape=32"
        head, want, code = (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n"), 413, "body_too_large"
    endless = kind.startswith("endless")
    limit = 4 * max(MAX_BODY, MAX_CONVERT)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            sent = 0
            try:
                s.sendall(head)
                while endless and sent < limit:
                    s.sendall(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server stopped reading: its answer came before the close
            if sent >= limit:
                stats.fail(f"hostile ({kind}): {sent} bytes taken without a 413")
                return
            answer = read_until_closed(s)
        if json_error(answer, 503) == "too_many_connections":
            stats.count("refused at the connection limit")
        elif endless and json_error(answer, 503) in ("queue_full", "inflight_limit"):
            # the service at capacity refuses the request from its headers, then cuts the body
            # at the body limit as it cuts any: also an answer, and the stream was not taken
            stats.count("hostile refused at capacity")
        elif not answer and kind == "headers over the buffer" and time.time() - t0 > CONN_TIMEOUT + 0.5:
            # a daemon too busy to read 256 KiB of headers within the header watchdog's limit
            # (--conn-timeout + 1 s) cuts the connection without an answer, as it cuts a trickle
            stats.count("hostile cut by the header timeout")
        elif b"100 Continue" in answer:
            stats.fail(f"hostile ({kind}): a 100 Continue")
        elif json_error(answer, want) != code:
            stats.fail(f"hostile ({kind}): expected a JSON {want} {code}, got {answer[:200]!r}")
        else:
            stats.count(f"hostile {want}")
    except OSError as e:
        stats.fail(f"hostile ({kind}) transport: {e!r}")


def flood(port, stats, windows):
    """Twice --max-connections idle connections, held 1.5 s: the last ones must have been
    answered 503 too_many_connections (JSON, Retry-After) and closed. Appends to windows the
    flood's start and the time its connections were all closed."""
    socks = []
    t0 = time.time()
    try:
        for _ in range(2 * MAX_CONNECTIONS):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(1.5)
        refused = 0
        for s in socks[-10:]:
            s.settimeout(1)
            try:
                answer = s.recv(65536)
            except socket.timeout:  # let in: others closed while the flood opened
                continue
            if json_error(answer, 503) == "too_many_connections" and b"Retry-After" in answer:
                refused += 1
            elif answer:
                stats.fail(f"flood: a connection past the limit got {answer[:200]!r}")
        if not refused:
            stats.fail(f"flood: none of the last 10 of {len(socks)} connections was refused")
        stats.count("flood")
    except OSError as e:
        stats.fail(f"flood transport: {e!r}")
    finally:
        for s in socks:
            s.close()
        windows.append((t0, time.time()))


def quantile(values, q):
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 100 else float("nan")


def healthz_figures(health, windows):
    """/healthz latencies (ms): all of them, and apart those taken while a flood held its
    connections or closed them (from its start to a second after its last close)."""
    during = [ms for t, ms in health if any(a <= t <= b + 1 for a, b in windows)]
    calm = [ms for t, ms in health if not any(a <= t <= b + 1 for a, b in windows)]
    every = [ms for _, ms in health]
    return {"n": len(every), "p50": statistics.median(every) if every else None, "p99": quantile(every, 99),
            "max": max(every) if every else None,
            "floods": {"n": len(during), "p99": quantile(during, 99), "max": max(during) if during else None},
            "between_floods": {"n": len(calm), "p99": quantile(calm, 99), "max": max(calm) if calm else None}}


def memory_verdict(rss, warm, rest):
    """The memory checks: rss, the RSS samples (MB) of the run; warm and rest, the /metrics
    gauges with the daemon idle after the capacity run and after the soak. Returns the failures
    and the figures.
    - RSS never above RSS_LIMIT_MB.
    - No leak: the bytes of live allocations, idle after the soak, within LEAK_MB of what they
      were idle before it. A leak, or a cache without a bound, keeps what it takes; the
      allocator's free memory (arenas, fragmentation) is not counted, whatever RSS says.
    - RSS levels off: the last quarter's median within 5 % + 16 MB of the third quarter's. The
      allocator keeping more free memory as more of its arenas meet the load's peaks grows
      less and less and passes; growth that goes on to the end fails."""
    failures, figures = [], {"max": max(rss) if rss else None, "bound": RSS_LIMIT_MB}
    if rss and max(rss) > RSS_LIMIT_MB:
        failures.append(f"RSS reached {max(rss):.0f} MB (bound {RSS_LIMIT_MB} MB)")
    live = [g.get("quantd_heap_in_use_bytes") if g else None for g in (warm, rest)]
    if None in live:
        failures.append("no heap figures from /metrics (quantd_heap_in_use_bytes) with the daemon idle")
    else:
        figures["live_heap_idle"] = [round(v / 2**20, 1) for v in live]
        figures["free_heap_idle"] = [round(g.get("quantd_heap_free_bytes", 0) / 2**20, 1) for g in (warm, rest)]
        grown = (live[1] - live[0]) / 2**20
        if grown > LEAK_MB:
            failures.append(f"live heap grew by {grown:.1f} MB over the soak (idle: {live[0] / 2**20:.1f} MB "
                            f"before, {live[1] / 2**20:.1f} MB after; limit {LEAK_MB} MB): a leak or a cache "
                            "without a bound")
    q = len(rss) // 4
    if q >= 2:
        third, last = statistics.median(rss[2 * q:3 * q]), statistics.median(rss[3 * q:])
        figures["quarter_medians"] = [round(statistics.median(rss[i * q:(i + 1) * q if i < 3 else None]), 1)
                                      for i in range(4)]
        if last > third * 1.05 + 16:
            failures.append(f"RSS still growing: median {third:.0f} MB in the third quarter, {last:.0f} MB in "
                            "the last")
    return failures, figures


def spool_files(tmpdir):
    return sorted(os.listdir(tmpdir)) if os.path.isdir(tmpdir) else []


HEAP_GAUGES = ("quantd_heap_in_use_bytes", "quantd_heap_free_bytes", "quantd_heap_arenas", "quantd_jobs_stored",
               "quantd_jobs_stored_bytes", "quantd_inflight_requests", "quantd_queue_depth", "quantd_jobs_running",
               "quantd_convert_queue_depth", "quantd_convert_jobs_running")


def gauges(port):
    """The heap and queue gauges of /metrics, or None (refused during a flood, or no answer)."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        status, _, text = request(c, "GET", "/metrics")
        c.close()
    except (OSError, Refused, http.client.HTTPException):
        return None
    if status != 200:
        return None
    out = {}
    for line in text.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in HEAP_GAUGES:
            out[name] = float(value)
    return out


def idle_gauges(port, timeout):
    """The gauges once nothing is received, queued, running or stored (the /metrics request
    itself is the one in flight), or the last ones seen when that does not come within timeout."""
    g, end = None, time.time() + timeout
    while time.time() < end:
        g = gauges(port)
        if g and g.get("quantd_inflight_requests", 0) <= 1 and not any(
                g.get(k) for k in ("quantd_jobs_stored", "quantd_queue_depth", "quantd_jobs_running",
                                   "quantd_convert_queue_depth", "quantd_convert_jobs_running")):
            return g
        time.sleep(0.5)
    return g


def proc_stat(pid):
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    st = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        st[k] = v.strip()
    return {"rss_mb": int(st["VmRSS"].split()[0]) / 1024, "threads": int(st["Threads"]), "fds": fds}


def soak(a, stats, state):
    """The run; fills stats and returns the result. state["server"] and state["tmpdir"] are set
    as soon as they exist, so that main can clean up whatever happens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.environ.get("SOAK_LOG", os.devnull), "w")
    # every connection of a flood is a descriptor, here and in the daemon (which inherits this)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # the daemon's spool files (POST /convert) go to a directory of its own, checked at the end
    tmpdir = state["tmpdir"] = tempfile.mkdtemp(prefix="quantd-soak-")
    # the daemon and the load generator on separate cores: otherwise the generator's threads,
    # as busy as the daemon at twice its capacity, would be what /healthz waits behind
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    daemon_cores, client_cores = cores[half:] or cores, cores[:half]
    os.sched_setaffinity(0, client_cores)
    server = state["server"] = subprocess.Popen(
        ["taskset", "-c", ",".join(map(str, daemon_cores)), a.quantd, "serve", "--listen", f"127.0.0.1:{port}",
         "--backend", "cpu", "--queue-depth", "8", "--conn-timeout", str(CONN_TIMEOUT), "--max-jobs", "256",
         "--result-ttl", "60", "--max-connections", str(MAX_CONNECTIONS), "--max-body-bytes", str(MAX_BODY),
         "--max-convert-bytes", str(MAX_CONVERT), "--max-inflight-bytes", str(MAX_INFLIGHT)],
        stderr=log, env={**os.environ, "TMPDIR": tmpdir, **({"LD_PRELOAD": a.preload} if a.preload else {})})
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
    # the heap once the capacity run's requests are all answered: every path has been taken,
    # so what first use allocates for good is in it; a leak is what the soak adds to it
    warm = idle_gauges(port, 30)
    rate = 2 * capacity
    print(f"# capacity of the mix: {capacity:.1f} req/s; soaking at {rate:.1f} req/s for {a.seconds} s", flush=True)

    running = [True]
    samples = []
    threads = []

    def sampler():
        t0 = time.time()
        while running[0]:
            st = proc_stat(server.pid)
            st["t"] = time.time() - t0
            g = gauges(port) or {}
            st.update(heap_mb=g.get("quantd_heap_in_use_bytes", float("nan")) / 2**20,
                      heap_free_mb=g.get("quantd_heap_free_bytes", float("nan")) / 2**20,
                      arenas=g.get("quantd_heap_arenas"))
            samples.append(st)
            time.sleep(2)

    probe_stop, wedged = multiprocessing.Event(), multiprocessing.Event()
    probe_out, probe_in = multiprocessing.Pipe(duplex=False)
    probe = multiprocessing.Process(target=prober, args=(port, probe_stop, wedged, probe_in), daemon=True)
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

    def hostile_loop():
        kinds = ["headers over the buffer", "content-length 10^14", "endless chunked /quantize",
                 "endless chunked /convert"]
        i = 0
        while running[0]:
            hostile(port, stats, kinds[i % len(kinds)], mix.model)
            i += 1
            time.sleep(0.5)

    flood_windows = []
    def flood_loop():
        while running[0]:
            for _ in range(FLOOD_EVERY_S * 10):
                if not running[0]:
                    return
                time.sleep(0.1)
            flood(port, stats, flood_windows)

    for fn in (sampler, slow_loop, hostile_loop, flood_loop):
        t = threading.Thread(target=fn, daemon=True)
        t.start()
        threads.append(t)

    # open loop: a dispatcher starts each request on its schedule in a thread of its own
    rng = random.Random(7)
    t0 = time.time()
    next_at = t0
    inflight = []
    while time.time() - t0 < a.seconds and not wedged.is_set():
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
    running[0] = False
    probe_stop.set()
    health, health_refused, probe_failures = probe_out.recv()
    probe.join(timeout=10)
    for f in probe_failures:
        stats.fail(f)
    result = {"seconds": a.seconds, "capacity_rps": capacity, "rate_rps": rate}
    if wedged.is_set():  # nothing more to learn from it; SIGTERM would hang
        stats.fail(f"the daemon wedged {time.time() - t0:.0f} s into the run (/healthz answered nothing for "
                   f"{WEDGE_S} s): killed", first=True)
        server.kill()
        server.wait()
        result.update(counts=stats.counts, failures=stats.failures)
        return result
    for th in inflight:
        th.join(timeout=600)
    for t in threads:
        t.join(timeout=CONN_TIMEOUT * 6)
    time.sleep(CONN_TIMEOUT + 1)  # connections of walked-away clients time out
    after = proc_stat(server.pid)  # (before idle_gauges' own connections, still closing after it)
    rest = idle_gauges(port, 30)
    # still serving: /healthz and a real request
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        hs, _, _ = request(c, "GET", "/healthz")
        q, ct, body = mix.bodies[0]
        qs, _, _ = request(c, "POST", f"/quantize?fmt=q8_0&{q}", body, {"Content-Type": ct})
        c.close()
        if hs != 200 or qs != 200:
            stats.fail(f"not serving at the end: /healthz {hs}, /quantize {qs}", first=True)
    except Exception as e:  # noqa: BLE001
        stats.fail(f"not serving at the end: {e!r}", first=True)
    server.send_signal(15)
    try:
        rc = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        stats.fail("SIGTERM: still running after 30 s: killed", first=True)
        server.kill()
        rc = server.wait()
    left = spool_files(tmpdir)
    if left:
        stats.fail(f"files left in the daemon's TMPDIR: {left[:5]}", first=True)

    # verdicts
    lost = stats.accepted - stats.answered - stats.cancelled
    if lost:
        stats.fail(f"{len(lost)} accepted jobs neither answered nor cancelled, e.g. {sorted(lost)[:3]}", first=True)
    latency = healthz_figures(health, flood_windows)
    hp99 = latency["p99"]
    if not hp99 < HEALTHZ_P99_MS:
        stats.fail(f"/healthz p99 {hp99:.2f} ms (limit {HEALTHZ_P99_MS})")
    rss = [s["rss_mb"] for s in samples]
    memory_failures, memory = memory_verdict(rss, warm, rest)
    for f in memory_failures:
        stats.fail(f, first=not f.startswith("RSS still growing"))  # a bound or a leak decides alone
    if after["fds"] != before["fds"]:
        stats.fail(f"open fds {before['fds']} before, {after['fds']} after")
    if after["threads"] != before["threads"]:
        stats.fail(f"threads {before['threads']} before, {after['threads']} after")
    if rc != 0:
        stats.fail(f"SIGTERM: exit status {rc}")
    if not stats.counts.get("sync 503", 0) + stats.counts.get("async submit 503", 0):
        stats.fail("no 503 at twice the capacity: the overload never showed")
    if a.seconds > FLOOD_EVERY_S + 5 and not stats.counts.get("flood"):
        stats.fail("no connection flood ran")
    result.update({"counts": stats.counts,
                   "jobs": {"accepted": len(stats.accepted), "answered": len(stats.answered),
                            "cancelled": len(stats.cancelled), "lost": len(lost)},
                   "healthz_ms": {**latency, "refused_during_floods": health_refused},
                   "rss_mb": {"at_rest": before["rss_mb"], "idle_after": after["rss_mb"], **memory,
                              # one sample in ten, to see whether it levels off
                              "series": [round(v, 1) for v in rss[::10]]},
                   "heap_mb": {"in_use": [round(s["heap_mb"], 1) for s in samples[::10]],
                               "free": [round(s["heap_free_mb"], 1) for s in samples[::10]],
                               "arenas": [s["arenas"] for s in samples[::10]]},
                   "fds": [before["fds"], after["fds"]], "threads": [before["threads"], after["threads"]],
                   "slow_clients": {k: [round(t, 2) for kk, t in slow_times if kk == k] for k in
                                    ("trickled headers", "trickled body", "stalled body", "unread answer")},
                   "spool_files_left": left, "exit_status": rc, "failures": stats.failures})
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=int(os.environ.get("SOAK_SECONDS", 600)))
    ap.add_argument("--json")
    ap.add_argument("--quantd", default=os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd")))
    ap.add_argument("--preload", help="a library the daemon is started with (LD_PRELOAD): make soak-leak-check "
                    "gives it tests/soak/leak.c, a leak the verdict must catch")
    a = ap.parse_args()
    stats, state, result = Stats(), {}, {"seconds": a.seconds}
    try:
        result = soak(a, stats, state)
    except BaseException as e:  # noqa: BLE001 - the verdict line comes whatever happened
        stats.fail(f"the soak itself failed: {e!r}", first=True)
        traceback.print_exc()
        result["failures"] = stats.failures
    finally:
        server = state.get("server")
        if server and server.poll() is None:
            server.kill()
            server.wait()
        if state.get("tmpdir"):
            shutil.rmtree(state["tmpdir"], ignore_errors=True)
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if stats.failures:
        print(f"VERDICT: FAIL: {'; '.join(stats.failures[:10])}", flush=True)
        sys.exit(1)
    c = result.get("counts", {})
    print(f"VERDICT: PASS: {a.seconds} s at {result.get('rate_rps', 0):.0f} req/s, "
          f"{len(stats.accepted)} jobs accepted, 0 lost, {c.get('flood', 0)} floods, "
          f"{sum(v for k, v in c.items() if k.startswith('hostile'))} hostile requests refused, "
          f"/healthz p99 {result['healthz_ms']['p99']:.1f} ms, RSS max {result['rss_mb']['max']:.0f} MB "
          f"(bound {RSS_LIMIT_MB}), daemon serving at the end, SIGTERM exit 0, no spool file left", flush=True)


if __name__ == "__main__":
    main()
