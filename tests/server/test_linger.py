"""The lingering close (server/http/linger.c), met by the clients most ML users script with:
Python's urllib, http.client and requests write the whole body before they read, so an answer
that refuses a body before or while it is sent (413, 401, 431) only reaches them when the server
reads and drops the rest of it for a while before the close. Bounded: past --linger-bytes the
connection is reset, past --linger-timeout it is closed, past --linger-connections an early
answer closes at once, and none of it delays SIGTERM. Each test starts its own
`quantd serve` ($QUANTD) on a free loopback port; its log goes to $QUANTD_TEST_LOG when set."""
import http.client
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))
MIB = 1 << 20
TOKEN = "s3cret"


class Server:
    def __init__(self, *flags):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        log = os.environ.get("QUANTD_TEST_LOG")
        self.log = open(log, "ab") if log else subprocess.DEVNULL
        self.p = subprocess.Popen([QUANTD, "serve", "--listen", f"127.0.0.1:{self.port}", "--backend", "cpu",
                                   *map(str, flags)], stdout=subprocess.DEVNULL, stderr=self.log)
        for _ in range(1000):
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=1).read()
                return
            except OSError:
                if self.p.poll() is not None:
                    raise AssertionError(f"quantd serve exited at start ({self.p.returncode})")
                time.sleep(0.02)
        raise AssertionError("quantd serve did not answer /healthz")

    def metric(self, name):
        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} missing from /metrics")

    def stop(self, within_s=30):
        """SIGTERM; the exit status (0: drained and, under ASan, no leak) and the seconds it took."""
        t0 = time.monotonic()
        self.p.terminate()
        rc = self.p.wait(timeout=within_s)
        if self.log is not subprocess.DEVNULL:
            self.log.close()
        return rc, time.monotonic() - t0


@pytest.fixture
def serve():
    started = []

    def start(*flags):
        started.append(Server(*flags))
        return started[-1]
    yield start
    for s in started:
        if s.p.poll() is None:
            s.p.kill()
            s.p.wait()


def urllib_post(url, body, headers=None):
    """urllib's POST: the whole body written before the answer is read. (status, headers, body)."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/octet-stream", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def error_code(body):
    return json.loads(body)["error"]["code"]


def head(path, length, *extra):
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/octet-stream",
             f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_until_closed(sock, timeout_s=10):
    sock.settimeout(timeout_s)
    out = b""
    while True:
        try:
            got = sock.recv(65536)
        except ConnectionResetError:
            break
        if not got:
            break
        out += got
    return out


def test_urllib_reads_the_413_of_a_body_over_the_limit(serve):
    s = serve("--max-body-bytes", MIB, "--max-convert-bytes", MIB)
    body = bytes(8 * MIB)
    for path, flag in (("/quantize?fmt=q8_0&dtype=f32&shape=2097152", "--max-body-bytes"),
                       ("/convert?fmt=q8_0", "--max-convert-bytes")):
        status, _, answer = urllib_post(s.base + path, body)
        assert status == 413, answer
        assert error_code(answer) == "body_too_large" and flag in json.loads(answer)["error"]["message"]
    # http.client, the same body in one request() call, and requests
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("POST", "/dequantize", body=body, headers={"Content-Type": "application/octet-stream"})
    r = c.getresponse()
    assert r.status == 413 and error_code(r.read()) == "body_too_large"
    c.close()
    import requests  # (schemathesis's dependency in the venv)
    r = requests.post(s.base + "/quantize?fmt=q8_0&dtype=f32&shape=2097152", data=body, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert s.metric("quantd_lingered_connections_total") >= 4
    assert s.stop()[0] == 0


def test_urllib_reads_a_chunked_body_cut_at_the_limit(serve):
    """A body without a Content-Length is refused in the middle (413 as it passes the limit); the
    rest is read and dropped all the same."""
    s = serve("--max-body-bytes", MIB)
    chunks = (bytes(64 * 1024) for _ in range(128))  # 8 MiB, sent chunked
    status, _, answer = urllib_post(s.base + "/quantize?fmt=q8_0&dtype=f32&shape=2097152", chunks)
    assert status == 413 and error_code(answer) == "body_too_large"
    assert s.stop()[0] == 0


def test_urllib_reads_the_401_and_a_waiting_client_gets_no_100_continue(serve):
    s = serve("--token", TOKEN, "--max-body-bytes", 64 * MIB)
    url = s.base + "/quantize?fmt=q8_0&dtype=f32&shape=2097152"
    status, headers, answer = urllib_post(url, bytes(8 * MIB), {"Authorization": "Bearer wrong"})
    assert status == 401 and error_code(answer) == "unauthorized"
    assert headers["WWW-Authenticate"] == "Bearer"
    # a client that waits for 100 Continue gets the refusal instead, at once, and the close
    for length, want, code in ((8 * MIB, b"HTTP/1.1 401", "unauthorized"),
                               (100 * 10 ** 12, b"HTTP/1.1 413", "body_too_large")):
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            t0 = time.monotonic()
            c.sendall(head("/quantize?fmt=q8_0&dtype=f32&shape=32", length, "Expect: 100-continue"))
            answer = read_until_closed(c)
            assert time.monotonic() - t0 < 5
        assert b"100 Continue" not in answer
        assert answer.startswith(want), answer[:200]
        assert error_code(answer.split(b"\r\n\r\n", 1)[1]) == code
    # the token still works, and a refused request without a body keeps its connection
    status, _, _ = urllib_post(s.base + "/quantize?fmt=q8_0&dtype=f32&shape=32", bytes(128),
                               {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    for _ in range(2):
        c.request("GET", "/formats", headers={"Authorization": "Bearer wrong"})
        r = c.getresponse()
        assert r.status == 401 and not r.will_close
        r.read()
    c.close()
    assert s.stop()[0] == 0


def test_urllib_reads_the_431_of_headers_too_large(serve):
    """Over --max-header-bytes (quantd's check), and past libmicrohttpd's 256 KiB buffer (its
    own refusal, answered by quantd), with a body behind."""
    s = serve("--max-body-bytes", 64 * MIB)
    for size in (20000, 300000):
        status, _, answer = urllib_post(s.base + "/dequantize", bytes(8 * MIB), {"X-Big": "a" * size})
        assert status == 431 and error_code(answer) == "headers_too_large", (size, answer)
    assert s.metric("quantd_lingered_connections_total") == 2
    assert s.stop()[0] == 0


def test_a_body_past_the_linger_bytes_is_reset_not_held(serve):
    """64 MiB sent against a 1 MiB lingering bound: the server drops exactly 1 MiB and resets the
    connection; the client learns it at once (a reset, or the 413 if it read first), never hangs
    until the timeout."""
    s = serve("--max-body-bytes", MIB, "--linger-bytes", MIB, "--linger-timeout", 60)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    t0 = time.monotonic()
    try:
        c.request("POST", "/dequantize", body=bytes(64 * MIB), headers={"Content-Type": "application/octet-stream"})
        r = c.getresponse()
        assert r.status == 413 and error_code(r.read()) == "body_too_large"
    except (ConnectionResetError, BrokenPipeError):
        pass
    assert time.monotonic() - t0 < 20
    c.close()
    for _ in range(100):
        if s.metric("quantd_lingering_connections") == 0:
            break
        time.sleep(0.05)
    assert s.metric("quantd_lingering_connections") == 0
    assert s.metric("quantd_lingered_bytes_total") == MIB
    assert s.stop()[0] == 0


def test_lingering_ends_at_its_timeout(serve):
    """A client that sends nothing more and never closes is closed after --linger-timeout."""
    s = serve("--max-body-bytes", MIB, "--linger-timeout", 1)
    with socket.create_connection(("127.0.0.1", s.port)) as c:
        c.sendall(head("/dequantize", 8 * MIB))
        answer = read_until_closed(c)  # the server's sending side ends with the answer
        assert answer.startswith(b"HTTP/1.1 413")
        t0 = time.monotonic()
        assert s.metric("quantd_lingering_connections") == 1
        while s.metric("quantd_lingering_connections") == 1 and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        waited = time.monotonic() - t0
        assert s.metric("quantd_lingering_connections") == 0
        assert waited < 5, waited
        c.settimeout(5)  # the server's side is closed: the next bytes meet a reset
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(100):
                c.sendall(bytes(65536))
                time.sleep(0.01)
    assert s.stop()[0] == 0


def test_lingering_connections_are_bounded_and_do_not_delay_the_stop(serve):
    s = serve("--max-body-bytes", MIB, "--linger-connections", 2, "--linger-timeout", 600)
    held = []
    for _ in range(3):
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(head("/dequantize", 8 * MIB))
        answer = read_until_closed(c)
        assert answer.startswith(b"HTTP/1.1 413") and error_code(answer.split(b"\r\n\r\n", 1)[1]) == "body_too_large"
        held.append(c)
    assert s.metric("quantd_lingering_connections") == 2
    assert s.metric("quantd_linger_full_total") == 1
    assert s.metric("quantd_lingered_connections_total") == 2
    rc, seconds = s.stop()
    assert rc == 0 and seconds < 10, (rc, seconds)
    for c in held:
        c.close()


def test_lingering_off_closes_at_once(serve):
    s = serve("--max-body-bytes", MIB, "--linger-timeout", 0)
    with socket.create_connection(("127.0.0.1", s.port)) as c:
        c.sendall(head("/dequantize", 8 * MIB, "Expect: 100-continue"))
        answer = read_until_closed(c)
    assert answer.startswith(b"HTTP/1.1 413") and b"100 Continue" not in answer
    assert s.metric("quantd_lingered_connections_total") == 0
    assert s.stop()[0] == 0
