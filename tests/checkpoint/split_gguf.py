#!/usr/bin/env python3
"""Cuts a GGUF file into shards the way llama.cpp's `llama-gguf-split --split` does, so that the
tests have split models without llama.cpp: PREFIX-0000K-of-0000N.gguf, the tensors in the
input's order, a new shard every --tensors N tensors (or before a tensor that would take the
shard's padded tensor bytes past --size BYTES); the first shard holds every key of the input,
each shard then split.no (u16), split.tensors.count (i32) and split.count (u16); GGUF v3, data
aligned to 32 and each tensor zero-padded to it. tests/fixtures/gguf_options records the
SHA-256 of gguf-split's own shards, which the tests compare these with.

usage: split_gguf.py IN PREFIX (--tensors N | --size BYTES)"""
import argparse
import struct

import gguf

ALIGN = 32


def pad(n):
    return -(-n // ALIGN) * ALIGN


def key_value(key, kind, fmt, value):
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", kind) + struct.pack(fmt, value)


def shards(reader, by_tensors, by_size):
    """Lists of tensors, one per shard, as gguf-split cuts them."""
    out, cur, size = [], [], 0
    for i, t in enumerate(reader.tensors):
        n = pad(int(t.n_bytes))
        cut = i > 0 and i % by_tensors == 0 if by_tensors else size + n > by_size
        if cut:
            if not cur:
                raise SystemExit(f"tensor {t.name} alone is larger than a split")
            out.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("prefix")
    ap.add_argument("--tensors", type=int, default=0)
    ap.add_argument("--size", type=int, default=0)
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    # every key's serialized bytes as the input holds them (gguf-split copies them unchanged)
    kv = [b"".join(bytes(p) for p in f.parts) for f in r.fields.values() if not f.name.startswith("GGUF.")]
    parts = shards(r, a.tensors, a.size)
    total = sum(len(p) for p in parts)
    for k, part in enumerate(parts):
        keys = (kv if k == 0 else []) + [
            key_value("split.no", gguf.GGUFValueType.UINT16, "<H", k),
            key_value("split.tensors.count", gguf.GGUFValueType.INT32, "<i", total),
            key_value("split.count", gguf.GGUFValueType.UINT16, "<H", len(parts))]
        head = b"GGUF" + struct.pack("<IQQ", 3, len(part), len(keys)) + b"".join(keys)
        offset = 0
        for t in part:
            ne = [int(x) for x in t.shape]
            while len(ne) > 1 and ne[-1] == 1:  # ggml_n_dims: trailing 1s are not written
                ne.pop()
            name = t.name.encode()
            head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(ne))
            head += b"".join(struct.pack("<Q", x) for x in ne) + struct.pack("<IQ", int(t.tensor_type), offset)
            offset += pad(int(t.n_bytes))
        head += b"\0" * (pad(len(head)) - len(head))
        with open(f"{a.prefix}-{k + 1:05d}-of-{len(parts):05d}.gguf", "wb") as f:
            f.write(head)
            for t in part:
                data = t.data.tobytes()
                f.write(data + b"\0" * (pad(len(data)) - len(data)))


if __name__ == "__main__":
    main()
