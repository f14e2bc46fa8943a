#!/usr/bin/env python3
"""A tiny random Llama as llama.cpp loads it, written with the `gguf` package's own writer:
usage: tiny_gguf.py OUT.gguf [f32|f16|bf16] [--ffn N] [--layers N] [--hidden N] [--seed N] [--ctx N] [--cases]

The vocabulary is SentencePiece-style with byte fallback (<unk>, <s>, </s>, the 256 byte tokens
and a few pieces), so llama.cpp can tokenize any prompt. Norms are F32 (as convert_hf_to_gguf
writes them); the other weights take the dtype asked for. An --ffn that is not a multiple of 32
makes ffn_down's rows unsplittable into 32-blocks (llama-quantize's F16 fallback).

--cases: weights from an integer generator (the same floats on every machine and numpy version,
so quantized bytes recorded once stay comparable) with a hard case in every 8th row: zeros, a
constant, one outlier, huge, tiny, a ramp, heavy tails, plain."""
import argparse

import numpy as np
import gguf


def bf16(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def exact_weights(state, rows, cols, scale):
    """state: [a 64-bit counter], advanced. Sums of integers times powers of two: exact in f32, so no library rounding enters."""
    n = rows * cols
    idx = np.arange(n, dtype=np.uint64) + np.uint64(state[0])
    state[0] = (state[0] + n * 0x9E3779B97F4A7C15) % 2**64
    acc = np.zeros(n, dtype=np.int64)
    for k in range(4):  # four hashed 16-bit draws: roughly normal
        h = (idx * np.uint64(0x9E3779B97F4A7C15 + 2 * k + 1)) ^ (idx >> np.uint64(29))
        h = (h * np.uint64(0xBF58476D1CE4E5B9)) >> np.uint64(40)
        acc += (h & np.uint64(0xFFFF)).astype(np.int64) - 32768
    x = acc.astype(np.float32) * np.float32(2.0 ** -17)  # about N(0, 0.5)
    heavy = ((idx * np.uint64(0x94D049BB133111EB)) >> np.uint64(58)).astype(np.int64)  # 0..63
    x = np.where(heavy == 0, x * np.float32(64.0), x)  # 1 in 64: a tail value
    x = (x * np.float32(scale)).reshape(rows, cols)
    for r in range(rows):
        kind = r % 8
        if kind == 0:
            x[r] = 0.0
        elif kind == 1:
            x[r] = np.float32(0.75 * scale)
        elif kind == 2:
            x[r] = 0.0
            x[r, (r * 37) % cols] = np.float32(96.0)
        elif kind == 3:
            x[r] *= np.float32(2.0 ** 10)  # large (up to 2^15), still finite in f16
        elif kind == 4:
            x[r] *= np.float32(2.0 ** -14)  # tiny: f16 subnormals and zeros
        elif kind == 5:
            x[r] = (np.arange(cols, dtype=np.float32) * 2 - cols) * np.float32(2.0 ** -8)
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("dtype", nargs="?", default="f16", choices=["f32", "f16", "bf16"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=0, help="pad the vocabulary to N tokens")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=256, help="context_length")
    ap.add_argument("--cases", action="store_true")
    ap.add_argument("--no-file-type", action="store_true",
                    help="leave general.file_type out (llama.cpp's loader then guesses it)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    pieces = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁quant", "ize", "▁model"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    while len(tokens) < a.vocab:
        tokens.append(f"tok{len(tokens)}"), types.append(1), scores.append(-float(len(tokens)))
    vocab, h, hd = len(tokens), a.hidden, a.hidden // a.heads
    base = rng.standard_normal(1 << 24).astype(np.float32)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("quantd tiny llama")
    w.add_context_length(a.ctx)
    w.add_embedding_length(h)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if not a.no_file_type:
        w.add_file_type({"f32": 0, "f16": 1, "bf16": 32}[a.dtype])
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    state = [a.seed * 2654435761 % 2**64 or 1]

    def exact(rows, cols, scale):
        return exact_weights(state, rows, cols, scale)

    base16 = {}  # scale -> bf16(base * scale): the big bf16 tensors are rotations of it, no per-element math

    def weight(name, rows, cols, scale=0.05):
        if not a.cases and rows * cols > base.size and a.dtype == "bf16":
            if scale not in base16:
                base16[scale] = bf16(base * np.float32(scale))
            x = np.resize(np.roll(base16[scale], int(rng.integers(base.size))), rows * cols).reshape(rows, cols)
            w.add_tensor(name, x, raw_shape=x.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
            return
        if a.cases:
            x = exact(rows, cols, scale)
        elif rows * cols <= base.size:
            x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        else:  # big models (benchmarks): a rotated copy of one random block, fast to make
            x = np.resize(np.roll(base, int(rng.integers(base.size))), rows * cols).reshape(rows, cols) * scale
        if a.dtype == "f32":
            w.add_tensor(name, x)
        elif a.dtype == "f16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, bf16(x), raw_shape=x.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    def norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32))

    weight("token_embd.weight", vocab, h, 0.5)
    for i in range(a.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        weight(p + "attn_q.weight", h, h)
        weight(p + "attn_k.weight", a.kv_heads * hd, h)
        weight(p + "attn_v.weight", a.kv_heads * hd, h)
        weight(p + "attn_output.weight", h, h)
        norm(p + "ffn_norm.weight")
        weight(p + "ffn_gate.weight", a.ffn, h)
        weight(p + "ffn_up.weight", a.ffn, h)
        weight(p + "ffn_down.weight", h, a.ffn)
    norm("output_norm.weight")
    weight("output.weight", vocab, h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
