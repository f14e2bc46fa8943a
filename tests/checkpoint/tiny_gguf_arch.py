#!/usr/bin/env python3
"""Tiny GGUFs of the architectures whose tensors llama-quantize treats differently, written with
the `gguf` package's own writer and tiny_gguf.py's integer generator (the same floats on every
machine, a hard case in every 8th row), tensor names, shapes and metadata as llama.cpp's
convert_hf_to_gguf.py lays them out:

  llama-tied   no output.weight (the head is token_embd), hidden 160 and FFN 100: no row splits
               into 256-blocks (K-quant fallbacks)
  qwen2        q/k/v biases, tied head
  phi3         fused attn_qkv and ffn_up (gate and up in one tensor)
  gemma2       tied head, post-attention and post-FFN norms, logit softcapping
  qwen3moe     8 experts (llama-quantize's n_expert == 8 rules) as 3-D ffn_*_exps, router
               ffn_gate_inp, q/k norms
  deepseek2    MLA (attn_q_a/q_b, attn_kv_a_mqa, attn_kv_b), a leading dense layer, 4 routed
               experts and a shared one

usage: tiny_gguf_arch.py OUT.gguf ARCH [f32|f16|bf16]"""
import sys

import numpy as np
import gguf

from tiny_gguf import bf16, exact_weights

ARCHS = ("llama-tied", "qwen2", "phi3", "gemma2", "qwen3moe", "deepseek2")


def vocab():
    pieces = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁quant", "ize", "▁model"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def main():
    out, arch = sys.argv[1], sys.argv[2]
    dtype = sys.argv[3] if len(sys.argv) > 3 else "f16"
    if arch not in ARCHS:
        sys.exit(f"unknown arch {arch}: one of {', '.join(ARCHS)}")
    gguf_arch = "llama" if arch == "llama-tied" else arch
    h = 160 if arch == "llama-tied" else 256
    ffn = {"llama-tied": 100, "qwen2": 288, "phi3": 256, "gemma2": 256, "qwen3moe": 512, "deepseek2": 288}[arch]
    layers = 3
    heads, kv_heads = 4, 2
    hd = h // heads
    tokens, scores, types = vocab()
    nv = len(tokens)
    rng = np.random.default_rng(7)
    state = [0x5EED + ARCHS.index(arch)]

    w = gguf.GGUFWriter(out, gguf_arch)
    w.add_name(f"quantd tiny {arch}")
    p = gguf_arch + "."
    u32 = lambda k, v: w.add_uint32(p + k, v)
    f32 = lambda k, v: w.add_float32(p + k, v)
    u32("context_length", 256)
    u32("embedding_length", h)
    u32("block_count", layers)
    u32("feed_forward_length", ffn)
    u32("attention.head_count", heads)
    f32("attention.layer_norm_rms_epsilon", 1e-6)
    f32("rope.freq_base", 10000.0)
    if arch != "deepseek2":  # MLA sets its own below
        u32("attention.head_count_kv", kv_heads)
        u32("rope.dimension_count", hd)
    w.add_file_type({"f32": 0, "f16": 1, "bf16": 32}[dtype])
    w.add_vocab_size(nv)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    n_exp, exp_ff = 0, 0
    if arch == "gemma2":
        u32("attention.key_length", hd)
        u32("attention.value_length", hd)
        u32("attention.sliding_window", 128)
        f32("attn_logit_softcapping", 50.0)
        f32("final_logit_softcapping", 30.0)
    if arch == "phi3":
        u32("attention.sliding_window", 256)
    if arch == "qwen3moe":
        n_exp, exp_ff = 8, 128
        u32("expert_count", n_exp)
        u32("expert_used_count", 2)
        u32("expert_feed_forward_length", exp_ff)
        u32("attention.key_length", hd)
        u32("attention.value_length", hd)
    # MLA: 4 heads of 32 (no RoPE) + 16 (RoPE) key dims, 32 value dims, latent ranks 64 (kv) and 96 (q)
    nope, rope_d, vdim, kv_rank, q_rank = 32, 16, 32, 64, 96
    if arch == "deepseek2":
        n_exp, exp_ff = 4, 128
        u32("expert_count", n_exp)
        u32("expert_used_count", 2)
        u32("expert_feed_forward_length", exp_ff)
        u32("expert_shared_count", 1)
        u32("leading_dense_block_count", 1)
        f32("expert_weights_scale", 1.0)
        w.add_bool(p + "expert_weights_norm", True)
        u32("expert_gating_func", 2)
        u32("attention.q_lora_rank", q_rank)
        u32("attention.kv_lora_rank", kv_rank)
        u32("attention.key_length", nope + rope_d)
        u32("attention.value_length", vdim)
        u32("attention.head_count_kv", heads)
        u32("rope.dimension_count", rope_d)

    def put(name, x):
        if dtype == "f32" or x.ndim == 1:
            w.add_tensor(name, x.astype(np.float32))
        elif dtype == "f16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, bf16(x), raw_shape=x.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    def weight(name, rows, cols, scale=0.05, experts=0):
        x = exact_weights(state, rows * max(experts, 1), cols, scale)
        put(name, x.reshape(experts, rows, cols) if experts else x)

    def norm(name, n=h):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    weight("token_embd.weight", nv, h, 0.5)
    for i in range(layers):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        if arch == "phi3":
            weight(b + "attn_qkv.weight", h + 2 * kv_heads * hd, h)
        elif arch == "deepseek2":
            weight(b + "attn_q_a.weight", q_rank, h)
            norm(b + "attn_q_a_norm.weight", q_rank)
            weight(b + "attn_q_b.weight", heads * (nope + rope_d), q_rank)
            weight(b + "attn_kv_a_mqa.weight", kv_rank + rope_d, h)
            norm(b + "attn_kv_a_norm.weight", kv_rank)
            weight(b + "attn_kv_b.weight", heads * (nope + vdim), kv_rank)
        else:
            weight(b + "attn_q.weight", h, h)
            weight(b + "attn_k.weight", kv_heads * hd, h)
            weight(b + "attn_v.weight", kv_heads * hd, h)
            if arch == "qwen2":
                for t, n in (("attn_q", h), ("attn_k", kv_heads * hd), ("attn_v", kv_heads * hd)):
                    w.add_tensor(b + t + ".bias", (0.01 * rng.standard_normal(n)).astype(np.float32))
            if arch == "qwen3moe":
                norm(b + "attn_q_norm.weight", hd)
                norm(b + "attn_k_norm.weight", hd)
        out_in = heads * vdim if arch == "deepseek2" else h
        weight(b + "attn_output.weight", h, out_in)
        if arch == "gemma2":
            norm(b + "post_attention_norm.weight")
        norm(b + "ffn_norm.weight")
        if n_exp and not (arch == "deepseek2" and i == 0):
            weight(b + "ffn_gate_inp.weight", n_exp, h)
            weight(b + "ffn_gate_exps.weight", exp_ff, h, experts=n_exp)
            weight(b + "ffn_up_exps.weight", exp_ff, h, experts=n_exp)
            weight(b + "ffn_down_exps.weight", h, exp_ff, experts=n_exp)
            if arch == "deepseek2":
                w.add_tensor(b + "exp_probs_b.bias", np.zeros(n_exp, dtype=np.float32))
                weight(b + "ffn_gate_shexp.weight", exp_ff, h)
                weight(b + "ffn_up_shexp.weight", exp_ff, h)
                weight(b + "ffn_down_shexp.weight", h, exp_ff)
        elif arch == "phi3":
            weight(b + "ffn_up.weight", 2 * ffn, h)
            weight(b + "ffn_down.weight", h, ffn)
        else:
            weight(b + "ffn_gate.weight", ffn, h)
            weight(b + "ffn_up.weight", ffn, h)
            weight(b + "ffn_down.weight", h, ffn)
        if arch == "gemma2":
            norm(b + "post_ffw_norm.weight")
    norm("output_norm.weight")
    if arch in ("phi3", "qwen3moe", "deepseek2"):
        weight("output.weight", nv, h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
