#!/usr/bin/env python3
"""A tiny random Llama as a Hugging Face directory, written with the `safetensors` package's own
writer: config.json, tokenizer_config.json, generation_config.json and the weights, in one
model.safetensors or in shards with model.safetensors.index.json (as save_pretrained lays them).
usage: tiny_hf.py OUTDIR [f32|f16|bf16] [--shards N] [--tied] [--hidden N] [--ffn N] [--layers N]
       [--linear-std S] [--tokenizer]
       tiny_hf.py OUTDIR --arch tests/fixtures/arch/NAME.json [--tokenizer]
--tokenizer adds a tiny word-level tokenizer (tokenizer.json), which mlx-lm needs to load a model.
The second form writes the source model of an architecture observation (make_arch_table.py): the
tensor names, dtypes and shapes and the config files transformers' save_pretrained wrote, every
value from arch_values() (seeded by the tensor's name), so the same bytes come out without torch."""
import argparse
import hashlib
import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

DT = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
TORCH = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


# Planted in rows 0-2 of every 2-D float tensor of an architecture source, where quantizers disagree:
# row 0: (k + 0.5) * 2^-7 for k = -8..7 in every group of 16: the 4-bit symmetric scale is 2^-7 and
#        every quotient a tie (.5);
# row 1: a 0.06103515625 maximum and 0.01556396484375 beside it: W8A16's scale rounds to bf16
#        0.0004787445068359375, the quotient is 32.5 rounded to bf16 but 32.50996 in f32;
# row 2: one 0.5 outlier (its group's scale 25x the others').
ROW1_AMAX, ROW1_X = 0.06103515625, 0.01556396484375


def arch_values(name, dtype, shape, seed=0):
    """One source tensor of an architecture fixture as numpy, from its name alone: N(0, 0.02) as
    transformers initializes Linear and embedding weights (norms 1 + N(0, 0.1), so that Gemma's
    1 + w and the others' w both stay near their trained size), hard rows planted in 2-D tensors."""
    digest = hashlib.sha256(name.encode()).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    x = rng.standard_normal(shape).astype(np.float32)
    if len(shape) == 1 and "norm" in name:
        x = 1 + 0.1 * x
    else:
        x = 0.02 * x
    if len(shape) == 2 and shape[0] >= 3 and shape[1] >= 16:
        cols = shape[1]
        x[0] = ((np.arange(cols) % 16) - 8 + 0.5) * 2.0 ** -7
        x[1] = np.clip(x[1], -0.05, 0.05)
        x[1, 0], x[1, 1] = ROW1_AMAX, ROW1_X
        x[2, 3] = 0.5
    return x.astype(NP_DT[dtype])


NP_DT = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


def write_arch(spec, out, seed=0):
    """The source model an architecture observation records (its "source": config files and
    tensors) into the directory out, values from arch_values()."""
    os.makedirs(out, exist_ok=True)
    t = {name: arch_values(name, e["dtype"], e["shape"], seed) for name, e in spec["tensors"].items()}
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for fn, text in spec["files"].items():
        with open(os.path.join(out, fn), "w") as f:
            f.write(text)
    return t


def write_tokenizer(out, vocab):
    """A tiny tokenizer beside the model (mlx-lm's load needs one): a word-level tokenizers JSON
    whose vocab is "<unk>", "<s>", "</s>" and "w3" ... "w{vocab-1}", split on whitespace, and a
    tokenizer_config.json naming transformers' fast tokenizer class."""
    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    words.update({f"w{i}": i for i in range(3, vocab)})
    special = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for c, i in list(words.items())[:3]]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
           "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 256}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", help="an architecture observation (tests/fixtures/arch/*.json): write its source")
    ap.add_argument("dtype", nargs="?", default="bf16", choices=sorted(DT))
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=320)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--linear-std", type=float, default=0.05, help="std of the Linear weights")
    ap.add_argument("--tokenizer", action="store_true", help="add a tiny tokenizer (write_tokenizer)")
    a = ap.parse_args()
    if a.arch:
        with open(a.arch) as f:
            spec = json.load(f)["source"]
        write_arch(spec, a.out)
        if a.tokenizer:
            write_tokenizer(a.out, json.loads(spec["files"]["config.json"]).get("vocab_size", 320))
        return
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
    if a.tokenizer:
        write_tokenizer(a.out, a.vocab)
    else:
        with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 256}, f)


if __name__ == "__main__":
    main()
