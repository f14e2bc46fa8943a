#!/usr/bin/env python3
"""A tiny random Llama as a Hugging Face directory, written with the `safetensors` package's own
writer: config.json, tokenizer_config.json, generation_config.json and the weights, in one
model.safetensors or in shards with model.safetensors.index.json (as save_pretrained lays them).
usage: tiny_hf.py OUTDIR [f32|f16|bf16] [--shards N] [--tied] [--hidden N] [--ffn N] [--layers N]
       [--linear-std S]"""
import argparse
import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

DT = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
TORCH = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("dtype", nargs="?", default="bf16", choices=sorted(DT))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=320)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--linear-std", type=float, default=0.05, help="std of the Linear weights")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    h, heads, kv = a.hidden, 4, 2
    hd = h // heads
    t = {}

    def w(name, *shape, scale=None):
        t[name] = (rng.standard_normal(shape) * (a.linear_std if scale is None else scale)).astype(np.float32).astype(DT[a.dtype])

    w("model.embed_tokens.weight", a.vocab, h, scale=0.5)
    for i in range(a.layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(DT[a.dtype])
        w(p + "self_attn.q_proj.weight", h, h)
        w(p + "self_attn.k_proj.weight", kv * hd, h)
        w(p + "self_attn.v_proj.weight", kv * hd, h)
        w(p + "self_attn.o_proj.weight", h, h)
        t[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(DT[a.dtype])
        w(p + "mlp.gate_proj.weight", a.ffn, h)
        w(p + "mlp.up_proj.weight", a.ffn, h)
        w(p + "mlp.down_proj.weight", h, a.ffn)
    t["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(DT[a.dtype])
    if not a.tied:
        w("lm_head.weight", a.vocab, h)
    os.makedirs(a.out, exist_ok=True)
    names = list(t)
    if a.shards == 1:
        save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    else:
        per = (len(names) + a.shards - 1) // a.shards
        wm = {}
        for k in range(a.shards):
            fn = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
            part = {n: t[n] for n in names[k * per:(k + 1) * per]}
            save_file(part, os.path.join(a.out, fn), metadata={"format": "pt"})
            wm.update({n: fn for n in part})
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(v.nbytes for v in t.values())}, "weight_map": wm}, f, indent=2)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": a.ffn, "num_hidden_layers": a.layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "vocab_size": a.vocab, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": a.tied, "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": TORCH[a.dtype]}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 256}, f)


if __name__ == "__main__":
    main()
