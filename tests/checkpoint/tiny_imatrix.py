#!/usr/bin/env python3
"""A synthetic importance matrix for a GGUF model, in either of the formats llama-quantize reads
(as llama-imatrix writes them): one entry per 2-D or 3-D weight, its values integers over 64
(the same floats on every machine), counts that make every division inexact but the same in
f32 everywhere.

  gguf  "<name>.in_sum2" (f32, columns x experts) and "<name>.counts" (f32, one per expert; the
        first expert of a 3-D tensor gets 0, which llama-quantize turns into importance 1), keys
        imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size
  dat   the legacy file: i32 entry count; per entry i32 name length, the name, i32 ncall, i32
        value count, the f32 values; then i32 chunk count, i32 dataset name length, the name

usage: tiny_imatrix.py MODEL.gguf OUT gguf|dat"""
import struct
import sys

import gguf
import numpy as np


def entries(model):
    rng = np.random.default_rng(17)
    out = []
    for t in gguf.GGUFReader(model).tensors:
        shape = [int(d) for d in t.shape]  # ne0 first
        if len(shape) < 2 or not t.name.endswith(".weight") or "norm" in t.name:
            continue
        experts = shape[2] if len(shape) > 2 else 1
        sums = (rng.integers(1, 4096, shape[0] * experts) / 64.0).astype(np.float32)
        counts = np.array([0.0 if experts > 1 and e == 0 else 7.0 + e for e in range(experts)], np.float32)
        out.append((t.name, sums, counts))
    return out


def main():
    model, path, kind = sys.argv[1:4]
    es = entries(model)
    if kind == "gguf":
        w = gguf.GGUFWriter(path, arch="")
        w.add_string("general.type", "imatrix")
        w.add_array("imatrix.datasets", ["tiny.txt"])
        w.add_uint32("imatrix.chunk_count", 12)
        w.add_uint32("imatrix.chunk_size", 512)
        for name, sums, counts in es:
            experts = len(counts)
            w.add_tensor(name + ".in_sum2", sums.reshape(experts, -1))
            w.add_tensor(name + ".counts", counts.reshape(experts, 1))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    elif kind == "dat":
        with open(path, "wb") as f:
            f.write(struct.pack("<i", len(es)))
            for i, (name, sums, _) in enumerate(es):
                raw = name.encode()
                f.write(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", 3 + i % 5, sums.size))
                f.write(sums.tobytes())
            f.write(struct.pack("<i", 12) + struct.pack("<i", 8) + b"tiny.txt")
    else:
        sys.exit("the format is gguf or dat")


if __name__ == "__main__":
    main()
