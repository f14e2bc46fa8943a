"""The tiny models the engine is held against llama.cpp with (tests/model/tiny_model.py's
arguments by case name), and what the checks share: running quantd perplexity, reading the
logits it dumps, the relative error of one set of logits against another."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "tiny_model.py")
FIXTURES = os.path.join(HERE, "..", "fixtures", "model")

N_CTX, N_CHUNKS = 64, 4

CASES = {
    "llama-untied": ["--arch", "llama", "--case", "untied"],
    "llama-tied": ["--arch", "llama", "--case", "tied"],
    "llama-rope-freqs": ["--arch", "llama", "--case", "rope-freqs"],
    "llama-gqa": ["--arch", "llama", "--case", "gqa", "--ffn", "150", "--layers", "3"],
    "qwen2": ["--arch", "qwen2", "--case", "gqa"],
    "qwen3": ["--arch", "qwen3", "--case", "gqa"],
    # ---- dense architectures beyond llama ----
    "gemma2": ["--arch", "gemma2", "--case", "gqa", "--layers", "3", "--post-norm", "0.0625"],
    "gemma3": ["--arch", "gemma3", "--case", "gqa", "--layers", "3", "--post-norm", "0.0625"],
    "phi3": ["--arch", "phi3", "--case", "gqa"],
    "phi3-longrope": ["--arch", "phi3", "--case", "longrope"],
    "mistral3": ["--arch", "mistral3", "--case", "tied", "--kv-heads", "2"],
    # mixtures of experts (8 experts, 2 or 4 a token)
    "mixtral": ["--arch", "llama", "--case", "gqa", "--experts", "8", "--experts-used", "2", "--ffn", "64"],
    "qwen2moe": ["--arch", "qwen2moe", "--case", "gqa", "--experts", "8", "--experts-used", "4", "--ffn", "96"],
    "qwen3moe": ["--arch", "qwen3moe", "--case", "gqa", "--experts", "8", "--experts-used", "2"],
    # DeepSeek V2's layout: q LoRA, k_b / v_b, softmax routing; V3's: one q, kv_b, sigmoid routing
    # with the choice bias, renormalised and scaled weights, groups; each with a leading dense block
    # and YaRN (V2's mscale_all_dim 0.707, V3's 1)
    "deepseek2": ["--arch", "deepseek2", "--layers", "3", "--experts", "8", "--experts-used", "2", "--mla-split",
                  "--ffn", "96", "--yarn", "40", "--yarn-orig", "32", "--yarn-log-mul", "0.0707"],
    "deepseek2-v3": ["--arch", "deepseek2", "--layers", "3", "--experts", "8", "--experts-used", "4", "--q-lora", "0",
                     "--ffn", "96", "--shared", "2", "--gating", "sigmoid", "--probs-bias", "--weights-norm",
                     "--weights-scale", "2.5", "--groups", "4", "--groups-used", "2", "--yarn", "4", "--yarn-orig", "16",
                     "--yarn-log-mul", "0.1"],
}

# The mixtures of experts: their routing is a discontinuity (a top-k choice between two experts
# whose probabilities nearly tie flips under a rounding of the order of f16's), so off llama.cpp's
# f32 path the comparisons allow for a few tokens routed otherwise: on llama.cpp's defaults (f16
# Q, K and V in flash attention) and in llama-perplexity, whose batches of several sequences run
# other kernels than a single sequence does (qwen3moe: one token of chunk 18 moves its ln PPL by
# 2.5e-4 while every logit of llama_logits's default run is within 5e-5 of quantd's).
MOE_CASES = frozenset(c for c, args in CASES.items() if "--experts" in args)
MOE_DEFAULT_LN_PPL_TOLERANCE = 1e-3


def make_model(case, path):
    subprocess.run([sys.executable, TINY, str(path), *CASES[case]], check=True)
    return path


def text():
    """The text the recorded figures were made from (tests/fixtures/model/text.txt)."""
    with open(os.path.join(FIXTURES, "text.txt"), encoding="utf-8") as f:
        return f.read()


def quantd_perplexity(quantd, model, tokens, dump, *extra):
    """quantd perplexity's JSON summary (its last stdout line), its logits dumped to `dump`."""
    p = subprocess.run([quantd, "perplexity", "-m", str(model), "--tokens", str(tokens), "-c", str(N_CTX),
                        "--chunks", str(N_CHUNKS), "--dump-logits", str(dump), *extra],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p


def read_logits(path, n_vocab):
    """[chunks * rows, n_vocab] f32: rows from position n_ctx/2 of each chunk."""
    return np.fromfile(path, dtype=np.float32).reshape(-1, n_vocab)


def relative_errors(ours, ref):
    """max |ours - ref| over a row, over the row's largest |ref|: the worst row, and over all rows at once."""
    diff = np.abs(ours.astype(np.float64) - ref)
    scale = np.abs(ref).max(axis=1)
    return float((diff.max(axis=1) / scale).max()), float(diff.max() / np.abs(ref).max())
