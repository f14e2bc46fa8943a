#!/usr/bin/env python3
"""Tiny seeded F32 models for the forward engine's checks, written with the `gguf` package's own
writer so that llama.cpp loads them:

    tiny_model.py OUT.gguf [--arch llama|qwen2|qwen3|gemma2|gemma3|phi3|mistral3|qwen2moe|qwen3moe|deepseek2]
                  [--case NAME] [--seed N] [--experts N --experts-used K] [sizes...]

Weights are about N(0, 0.02), as runtimes initialise them, from an integer generator (sums of
hashed 16-bit draws times a power of two: exact in f32, so the same floats on every machine and
numpy version and the figures recorded from llama.cpp stay valid). A few planted hard rows in
every matrix: one zero, one constant, one large (x8: the
FFN's three make activations some hundred times the others, as trained models' massive
activations are; x4 in q and k),
one with a single spike. Norm weights are about 1 with the same treatment.

Cases (--case): untied (an output.weight), tied (none: the token embedding serves),
rope-freqs (Llama 3's rope scaling: rope_freqs.weight from its factors), gqa (fewer key/value
heads than heads); qwen2 adds q/k/v biases, qwen3 per-head q/k norms and a head size that is not
n_embd / n_head (attention.key_length).

gemma2: post-attention and post-FFN norms, GELU, always tied; a sliding window of 8 tokens on
the even blocks (shorter than a chunk, so it masks), attention scores soft-capped at 1.5 and
logits at 6 (both well inside what the planted rows reach, so the caps bite). gemma3: gemma2's
block with q/k norms, a head size apart from n_embd / n_head, an output.weight of its own, a
window of 8 on two blocks of three (sliding_window_pattern 3) with their own rope base (10000)
while the global block has base 1e6 and linear rope scaling x8, logits soft-capped at 6. phi3:
q/k/v in one attn_qkv, gate and up in one ffn_up of 2 n_ff rows, GQA; its longrope case adds
LongRoPE (rope_factors_short/long, an original context of 32 so the long ones apply to chunks of
64, rope.scaling.attn_factor 1.19), q/k/v biases beside the fused matrix and a tied output.
mistral3: Llama's block with a head size apart from n_embd / n_head and biases on the
attention's output and the FFN.

Mixtures of experts: --experts N (llama: Mixtral's layout, ffn_gate_inp + ffn_{gate,up,down}_exps
in place of the dense FFN, each expert --ffn wide) with --experts-used K; qwen2moe (qwen2's
attention, experts --expert-ffn wide and a shared expert --ffn wide with its gate) and qwen3moe
(qwen3's attention, experts) need them. The router's weights are N(0, 0.3) without planted rows,
so that the router's probabilities differ enough for llama.cpp and quantd to choose the same
experts.

deepseek2 (multi-head latent attention, --experts needed): --q-lora N (0: one attn_q), --kv-lora,
--rope-dim / --nope-dim / --v-dim (each head's sizes), --mla-split (attn_k_b / attn_v_b, the split
form of attn_kv_b with attention.key_length_mla, which llama.cpp runs as one shared head),
--dense-lead N leading blocks with a dense --ffn FFN, then experts --expert-ffn wide with
--shared shared ones, --gating softmax|sigmoid, --probs-bias (exp_probs_b), --weights-norm,
--weights-scale, --groups G --groups-used U (group-limited routing), --yarn FACTOR with
--yarn-orig N and --yarn-log-mul M (rope.scaling.yarn_log_multiplier, 0.1 * mscale_all_dim as the
converter writes it).

The vocabulary is SentencePiece-style with byte fallback (<unk>, <s>, </s>, the 256 byte tokens,
a few pieces, padding tokens up to --vocab) so llama.cpp can tokenize any text; the tokenizer
KVs say add BOS."""
import argparse

import numpy as np
import gguf

CASES = ("untied", "tied", "rope-freqs", "gqa", "longrope")


class Weights:
    """Exact pseudo-normal weights: a 64-bit counter hashed into four 16-bit draws per value."""

    def __init__(self, seed):
        self.state = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64

    def normal(self, shape, std):
        n = int(np.prod(shape))
        idx = np.arange(n, dtype=np.uint64) + np.uint64(self.state)
        self.state = (self.state + n * 0x9E3779B97F4A7C15 + 1) % 2**64
        acc = np.zeros(n, dtype=np.int64)
        for k in range(4):
            h = (idx * np.uint64(0x9E3779B97F4A7C15 + 2 * k + 1)) ^ (idx >> np.uint64(29))
            h = (h * np.uint64(0xBF58476D1CE4E5B9)) >> np.uint64(40)
            acc += (h & np.uint64(0xFFFF)).astype(np.int64) - 32768
        # the sum of four uniform draws on [-32768, 32768) has a standard deviation of 37837.6;
        # the scale is a power of two near std / 37837.6, so every value stays exact
        scale = 2.0 ** np.round(np.log2(std / 37837.6))
        return (acc.astype(np.float32) * np.float32(scale)).reshape(shape)

    def matrix(self, rows, cols, std=0.02, large=8.0):
        x = self.normal((rows, cols), std)
        if rows >= 8:  # the planted rows, at positions that depend on the shape
            x[rows // 7] = 0.0
            x[rows // 5] = np.float32(std)
            x[rows // 3] *= np.float32(large)
            x[rows // 2] = 0.0
            x[rows // 2, (rows * 7) % cols] = np.float32(std * 50)
        return x

    def norm(self, n):
        x = np.float32(1.0) + self.normal((n,), 0.1)
        x[n // 3] = np.float32(3.0)
        return x


def llama3_rope_factors(n_rot, base, factor=8.0, low=1.0, high=4.0, orig=8192):
    """convert_hf_to_gguf's rope_freqs for rope_scaling type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, n_rot, 2, dtype=np.float32) / n_rot))
    low_wavelen, high_wavelen = orig / low, orig / high
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def add_deepseek2_keys(w, a, heads):
    """deepseek2's keys: the latent attention's sizes (the split form's shared head in key_length /
    value_length, one key/value head), the leading dense blocks, the experts' routing."""
    dk = a.nope_dim + a.rope_dim
    w.add_q_lora_rank(a.q_lora)
    w.add_kv_lora_rank(a.kv_lora)
    if a.mla_split:
        w.add_head_count_kv(1)
        w.add_key_length(a.kv_lora + a.rope_dim)
        w.add_value_length(a.kv_lora)
        w.add_key_length_mla(dk)
        w.add_value_length_mla(a.v_dim)
    else:
        w.add_head_count_kv(heads)
        w.add_key_length(dk)
        w.add_value_length(a.v_dim)
    w.add_leading_dense_block_count(a.dense_lead)
    w.add_expert_shared_count(a.shared)
    w.add_expert_weights_scale(a.weights_scale)
    w.add_expert_weights_norm(a.weights_norm)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if a.gating == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    if a.yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(a.yarn)
        w.add_rope_scaling_orig_ctx_len(a.yarn_orig)
        if a.yarn_log_mul:
            w.add_rope_scaling_yarn_log_mul(a.yarn_log_mul)
    if a.groups:
        w.add_expert_group_count(a.groups)
        w.add_expert_group_used_count(a.groups_used)


def add_deepseek2_block(w, g, p, a, h, heads, i):
    """One deepseek2 block: latent attention (q LoRA or one q; kv_b or its per-head halves k_b / v_b,
    cut from the same kv_b so that both forms hold the same model), then a dense FFN or experts."""
    dk, nope, dv, L = a.nope_dim + a.rope_dim, a.nope_dim, a.v_dim, a.kv_lora
    w.add_tensor(p + "attn_norm.weight", g.norm(h))
    if a.q_lora:
        w.add_tensor(p + "attn_q_a.weight", g.matrix(a.q_lora, h, large=4.0))
        w.add_tensor(p + "attn_q_a_norm.weight", g.norm(a.q_lora))
        w.add_tensor(p + "attn_q_b.weight", g.matrix(heads * dk, a.q_lora, large=4.0))
    else:
        w.add_tensor(p + "attn_q.weight", g.matrix(heads * dk, h, large=4.0))
    w.add_tensor(p + "attn_kv_a_mqa.weight", g.matrix(L + a.rope_dim, h, large=4.0))
    w.add_tensor(p + "attn_kv_a_norm.weight", g.norm(L))
    kv_b = g.matrix(heads * (nope + dv), L).reshape(heads, nope + dv, L)
    if a.mla_split:
        # k_b: GGUF {nope, L, heads} (each head's key half transposed), v_b: {L, dv, heads}
        w.add_tensor(p + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1)))
        w.add_tensor(p + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:, :]))
    else:
        w.add_tensor(p + "attn_kv_b.weight", kv_b.reshape(heads * (nope + dv), L))
    w.add_tensor(p + "attn_output.weight", g.matrix(h, heads * dv))
    w.add_tensor(p + "ffn_norm.weight", g.norm(h))
    if i < a.dense_lead:
        w.add_tensor(p + "ffn_gate.weight", g.matrix(a.ffn, h))
        w.add_tensor(p + "ffn_up.weight", g.matrix(a.ffn, h))
        w.add_tensor(p + "ffn_down.weight", g.matrix(h, a.ffn))
        return
    ff, sh = a.expert_ffn, a.expert_ffn * a.shared
    w.add_tensor(p + "ffn_gate_inp.weight", g.normal((a.experts, h), 0.3))
    if a.probs_bias:
        w.add_tensor(p + "exp_probs_b.bias", g.normal((a.experts,), 0.05))
    w.add_tensor(p + "ffn_gate_exps.weight", np.stack([g.matrix(ff, h) for _ in range(a.experts)]))
    w.add_tensor(p + "ffn_up_exps.weight", np.stack([g.matrix(ff, h) for _ in range(a.experts)]))
    w.add_tensor(p + "ffn_down_exps.weight", np.stack([g.matrix(h, ff) for _ in range(a.experts)]))
    w.add_tensor(p + "ffn_gate_shexp.weight", g.matrix(sh, h))
    w.add_tensor(p + "ffn_up_shexp.weight", g.matrix(sh, h))
    w.add_tensor(p + "ffn_down_shexp.weight", g.matrix(h, sh))


def add_experts(w, g, p, a, h):
    """A block's mixture of experts: the router, the experts' 3-D weights (numpy [n_expert][rows][cols]
    is GGUF's [cols, rows, n_expert]) and, for qwen2moe, the shared expert and its gate."""
    ff = a.ffn if a.arch == "llama" else a.expert_ffn
    w.add_tensor(p + "ffn_gate_inp.weight", g.normal((a.experts, h), 0.3))
    w.add_tensor(p + "ffn_gate_exps.weight", np.stack([g.matrix(ff, h) for _ in range(a.experts)]))
    w.add_tensor(p + "ffn_up_exps.weight", np.stack([g.matrix(ff, h) for _ in range(a.experts)]))
    w.add_tensor(p + "ffn_down_exps.weight", np.stack([g.matrix(h, ff) for _ in range(a.experts)]))
    if a.arch == "qwen2moe":
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", g.normal((h,), 0.3))
        w.add_tensor(p + "ffn_gate_shexp.weight", g.matrix(a.ffn, h))
        w.add_tensor(p + "ffn_up_shexp.weight", g.matrix(a.ffn, h))
        w.add_tensor(p + "ffn_down_shexp.weight", g.matrix(h, a.ffn))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral3",
                             "qwen2moe", "qwen3moe", "deepseek2"])
    ap.add_argument("--q-lora", type=int, default=48)
    ap.add_argument("--kv-lora", type=int, default=32)
    ap.add_argument("--rope-dim", type=int, default=16)
    ap.add_argument("--nope-dim", type=int, default=16)
    ap.add_argument("--v-dim", type=int, default=24)
    ap.add_argument("--mla-split", action="store_true")
    ap.add_argument("--dense-lead", type=int, default=1)
    ap.add_argument("--shared", type=int, default=1)
    ap.add_argument("--gating", default="softmax", choices=["softmax", "sigmoid"])
    ap.add_argument("--probs-bias", action="store_true")
    ap.add_argument("--weights-norm", action="store_true")
    ap.add_argument("--weights-scale", type=float, default=1.0)
    ap.add_argument("--groups", type=int, default=0)
    ap.add_argument("--groups-used", type=int, default=0)
    ap.add_argument("--yarn", type=float, default=0.0, help="YaRN's factor (0: no scaling)")
    ap.add_argument("--yarn-orig", type=int, default=32, help="rope.scaling.original_context_length")
    ap.add_argument("--yarn-log-mul", type=float, default=0.0)
    ap.add_argument("--experts", type=int, default=0, help="expert_count (0: a dense FFN)")
    ap.add_argument("--experts-used", type=int, default=2, help="expert_used_count")
    ap.add_argument("--expert-ffn", type=int, default=48, help="qwen2moe/qwen3moe: expert_feed_forward_length")
    ap.add_argument("--case", default="untied", choices=CASES)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=160)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0, help="default: heads (gqa: heads / 2)")
    ap.add_argument("--head-dim", type=int, default=0, help="qwen3: attention.key_length (default 24)")
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--ctx", type=int, default=256, help="context_length")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--post-norm", type=float, default=1.0, help="gemma: the post-norms' weights' scale")
    a = ap.parse_args()

    pieces = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁quant", "ize", "▁model", "e", "t", "▁"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    while len(tokens) < a.vocab:
        tokens.append(f"<pad{len(tokens)}>"), types.append(1), scores.append(-1000.0 - len(tokens))
    vocab, h = len(tokens), a.hidden
    heads = a.heads
    kv_heads = a.kv_heads or (heads // 2 if a.case == "gqa" else heads)
    qwen3_attn = a.arch in ("qwen3", "qwen3moe")
    hd = a.head_dim or (24 if a.arch in ("qwen3", "qwen3moe", "gemma3", "mistral3") else h // heads)
    if a.arch in ("qwen2moe", "qwen3moe", "deepseek2") and not a.experts:
        raise SystemExit(f"--arch {a.arch} needs --experts")
    base = 500000.0 if a.case == "rope-freqs" else 10000.0

    w = gguf.GGUFWriter(a.out, a.arch)
    # (llama.cpp's vocabulary loader looks up Phi-3's special tokens in any model named "phi3")
    w.add_name(f"quantd tiny {a.arch if a.arch != 'phi3' else 'phi-three'} {a.case}")
    w.add_context_length(a.ctx)
    w.add_embedding_length(h)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(heads)
    if a.arch != "deepseek2":  # add_deepseek2_keys says
        w.add_head_count_kv(kv_heads)
    if a.experts:
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.experts_used)
        if a.arch != "llama":
            w.add_expert_feed_forward_length(a.expert_ffn)
        if a.arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(a.ffn)
    if a.arch == "deepseek2":
        add_deepseek2_keys(w, a, heads)
    elif a.arch in ("qwen3", "qwen3moe", "gemma3", "mistral3") or hd != h // heads:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_dimension_count(a.rope_dim if a.arch == "deepseek2" else hd)
    w.add_layer_norm_rms_eps(1e-6 if a.arch != "llama" else 1e-5)
    w.add_rope_freq_base(1e6 if a.arch == "gemma3" else base)
    gemma = a.arch in ("gemma2", "gemma3")
    if gemma:
        w.add_sliding_window(8)
        w.add_final_logit_softcapping(6.0)
    if a.arch == "gemma2":
        w.add_attn_logit_softcapping(1.5)
    if a.case == "longrope":
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        w.add_rope_scaling_orig_ctx_len(32)
        w.add_rope_scaling_attn_factors(1.19)
    if a.arch == "gemma3":
        w.add_sliding_window_pattern(3)
        w.add_rope_freq_base_swa(10000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(8.0)
    w.add_file_type(0)
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
    w.add_add_eos_token(False)

    g = Weights(a.seed)
    # the token embedding and the output at a trained model's scale (their logits spread over a few
    # units, a large row some tens), the rest N(0, 0.02)
    w.add_tensor("token_embd.weight", g.matrix(vocab, h, 0.0625, 4.0))
    if a.case == "rope-freqs":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(hd, base))
    if a.case == "longrope":  # Phi-3's shape of factors: about 1 for the short, growing to some tens for the long
        ramp = np.linspace(0.0, 1.0, hd // 2, dtype=np.float32)
        w.add_tensor("rope_factors_short.weight", np.float32(1.0) + np.float32(0.1) * ramp)
        w.add_tensor("rope_factors_long.weight", np.float32(1.0) + np.float32(30.0) * ramp * ramp)
    for i in range(a.layers):
        p = f"blk.{i}."
        if a.arch == "deepseek2":
            add_deepseek2_block(w, g, p, a, h, heads, i)
            continue
        w.add_tensor(p + "attn_norm.weight", g.norm(h))
        # q and k's large rows at x4 (larger ones in both make scores whose f32 rounding alone moves
        # the logits by more than 1e-4: a float64 forward pass shows it)
        q = g.matrix(heads * hd, h, large=4.0)
        k = g.matrix(kv_heads * hd, h, large=4.0)
        v = g.matrix(kv_heads * hd, h)
        if a.arch == "phi3":
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            w.add_tensor(p + "attn_q.weight", q)
            w.add_tensor(p + "attn_k.weight", k)
            w.add_tensor(p + "attn_v.weight", v)
        if a.arch in ("qwen2", "qwen2moe") or a.case == "longrope":
            w.add_tensor(p + "attn_q.bias", g.normal((heads * hd,), 0.5))
            w.add_tensor(p + "attn_k.bias", g.normal((kv_heads * hd,), 0.5))
            w.add_tensor(p + "attn_v.bias", g.normal((kv_heads * hd,), 0.05))
        if qwen3_attn or a.arch == "gemma3":
            w.add_tensor(p + "attn_q_norm.weight", g.norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", g.norm(hd))
        w.add_tensor(p + "attn_output.weight", g.matrix(h, heads * hd))
        if a.arch == "mistral3":
            w.add_tensor(p + "attn_output.bias", g.normal((h,), 0.05))
        if gemma:
            w.add_tensor(p + "post_attention_norm.weight", g.norm(h) * np.float32(a.post_norm))
        w.add_tensor(p + "ffn_norm.weight", g.norm(h))
        if a.experts:
            add_experts(w, g, p, a, h)
        else:
            gate, up = g.matrix(a.ffn, h), g.matrix(a.ffn, h)
            if a.arch == "phi3":
                w.add_tensor(p + "ffn_up.weight", np.concatenate([gate, up]))
            else:
                w.add_tensor(p + "ffn_gate.weight", gate)
                w.add_tensor(p + "ffn_up.weight", up)
            w.add_tensor(p + "ffn_down.weight", g.matrix(h, a.ffn))
        if a.arch == "mistral3":
            w.add_tensor(p + "ffn_gate.bias", g.normal((a.ffn,), 0.5))
            w.add_tensor(p + "ffn_up.bias", g.normal((a.ffn,), 0.05))
            w.add_tensor(p + "ffn_down.bias", g.normal((h,), 0.05))
        if gemma:
            w.add_tensor(p + "post_ffw_norm.weight", g.norm(h) * np.float32(a.post_norm))
    w.add_tensor("output_norm.weight", g.norm(h))
    if a.case != "tied" and a.arch != "gemma2":  # gemma2 always reads the token embedding
        w.add_tensor("output.weight", g.matrix(vocab, h, 0.0625, 4.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
