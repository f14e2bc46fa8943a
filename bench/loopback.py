"""Loopback TCP ceiling for the service benchmark: N parallel connections each sending 64 MiB
messages to a reader for a few seconds (python's socket calls release the GIL, so this is the
kernel's copy rate). Usage: python3 bench/loopback.py [connections...]"""
import socket
import sys
import threading
import time


def run(n, seconds=3.0, msg=b"x" * (64 << 20)):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    total = [0]
    lock = threading.Lock()
    stop = time.time() + seconds

    def sink(c):
        buf = memoryview(bytearray(1 << 20))
        while True:
            k = c.recv_into(buf)
            if not k:
                break
            with lock:
                total[0] += k

    def acceptor():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=sink, args=(c,), daemon=True).start()

    threading.Thread(target=acceptor, daemon=True).start()

    def client():
        s = socket.create_connection(("127.0.0.1", port))
        while time.time() < stop:
            s.sendall(msg)
        s.close()

    t0 = time.time()
    ts = [threading.Thread(target=client) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0] / (time.time() - t0) / 1e9


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1, 4, 16]:
        print(f"# loopback TCP, {n} connections: {run(n):.2f} GB/s")
