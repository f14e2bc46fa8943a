#!/usr/bin/env python3
"""The durable-write bound of a conversion: write BYTES to a new file OUT the way quantd's
pipeline writes its output (WRITERS threads, each writing whole 16 MiB chunks with O_DIRECT at
their offsets, then one fsync), print the seconds, remove the file.

    python3 bench/write_bound.py OUT BYTES [--writers N] [--read IN [--readers N]]
                                 [--prealloc truncate|fallocate]

With --read, the copy bound: the same writes while READERS threads read all of IN (32 MiB
chunks, as quantd's readers take its pieces into their buffers), the seconds until both end. It
is a conversion with no work between reading and writing: on one machine, reading and writing
at once can each run slower than alone.

The default writer and reader counts are quantd's own (server/checkpoint/pipeline.c: 3 and 4 on 8
cores or more, else 1 and 1). A single `dd conv=fsync` stream is not the bound: on an H200 machine whose dd wrote 1.3
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


def default_readers():
    return 4 if (os.cpu_count() or 1) >= 8 else 1


READ_CHUNK = 32 << 20


def read_all(path, readers, errors):
    """Threads that read all of path, chunk k by reader k % readers; started, to be joined."""
    size = os.path.getsize(path)
    chunk = max(1, min(READ_CHUNK, size))
    fd = os.open(path, os.O_RDONLY)

    def reader(k):
        buf = bytearray(chunk)
        try:
            for at in range(k * chunk, size, readers * chunk):
                os.preadv(fd, [buf], at)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(readers)]
    for th in threads:
        th.start()
    return threads, fd


def measure(out, nbytes, writers, read=None, readers=None, prealloc=None):
    """Seconds to write nbytes (whole chunks) to the new file out and fsync it (and, given read,
    to read all of that file meanwhile); the file out removed. prealloc: "truncate" sizes the
    file first (sparse, as quantd's pipeline does), "fallocate" reserves its blocks first."""
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(CHUNK))
    chunks = (nbytes + CHUNK - 1) // CHUNK
    t = time.perf_counter()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(out, flags | os.O_DIRECT, 0o644)
    except OSError:
        fd = os.open(out, flags, 0o644)
    if prealloc == "truncate":
        os.ftruncate(fd, chunks * CHUNK)
    elif prealloc == "fallocate":
        os.posix_fallocate(fd, 0, chunks * CHUNK)
    errors = []
    reading, rfd = read_all(read, readers or default_readers(), errors) if read else ([], -1)

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
    for th in reading:
        th.join()
    wall = time.perf_counter() - t
    if rfd >= 0:
        os.close(rfd)
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
    ap.add_argument("--read", metavar="IN", help="read all of IN meanwhile (the copy bound)")
    ap.add_argument("--readers", type=int, default=default_readers())
    ap.add_argument("--prealloc", choices=["truncate", "fallocate"],
                    help="size the new file first: sparse (truncate) or with its blocks reserved (fallocate)")
    a = ap.parse_args()
    wall = measure(a.out, a.bytes, a.writers, a.read, a.readers, a.prealloc)
    also = f", reading {os.path.getsize(a.read)} bytes with {a.readers} readers" if a.read else ""
    also += f", {a.prealloc} first" if a.prealloc else ""
    print(f"{wall:.3f} s for {a.bytes} bytes, {a.writers} writers{also}: {a.bytes / wall / 1e9:.2f} GB/s written")


if __name__ == "__main__":
    main()
