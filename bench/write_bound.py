#!/usr/bin/env python3
"""The durable-write bound of a conversion: write BYTES to a new file OUT the way quantd's
pipeline writes its output (WRITERS threads, each writing whole 16 MiB chunks with O_DIRECT at
their offsets, then one fsync), print the seconds, remove the file.

    python3 bench/write_bound.py OUT BYTES [--writers N]

The default writer count is quantd's own (server/checkpoint/pipeline.c: 3 on 8 cores or more,
else 1). A single `dd conv=fsync` stream is not the bound: on an H200 machine whose dd wrote 1.3
GB/s, quantd wrote a 4.92 GB GGUF in 2.9 s. The data is random bytes, not zeros, so that no
layer can skip writing them. Where the file system refuses O_DIRECT (tmpfs), buffered writes."""
import argparse
import mmap
import os
import threading
import time

CHUNK = 16 << 20


def default_writers():
    return 3 if (os.cpu_count() or 1) >= 8 else 1


def measure(out, nbytes, writers):
    """Seconds to write nbytes (whole chunks) to the new file out and fsync it; the file removed."""
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(CHUNK))
    chunks = (nbytes + CHUNK - 1) // CHUNK
    t = time.perf_counter()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(out, flags | os.O_DIRECT, 0o644)
    except OSError:
        fd = os.open(out, flags, 0o644)
    errors = []

    def writer(k):
        try:
            for c in range(k, chunks, writers):
                if os.pwrite(fd, buf, c * CHUNK) != CHUNK:
                    raise OSError(f"short write at chunk {c}")
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    os.fsync(fd)
    os.close(fd)
    wall = time.perf_counter() - t
    os.unlink(out)
    buf.close()
    if errors:
        raise SystemExit(f"write_bound: {errors[0]}")
    return wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("bytes", type=int)
    ap.add_argument("--writers", type=int, default=default_writers())
    a = ap.parse_args()
    wall = measure(a.out, a.bytes, a.writers)
    print(f"{wall:.3f} s for {a.bytes} bytes, {a.writers} writers: {a.bytes / wall / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
