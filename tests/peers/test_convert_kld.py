"""quantd convert --kld TEXT: the output's KL divergence from its source in the convert summary,
the figures of `quantd perplexity --kl-divergence-base` on the source and `--kl-divergence` on
the output run by hand over the same text and chunks (the tiny llama-gqa model of
tests/model/cases.py, F32, converted to Q4_0 by --recipe); and the refusals, each before anything
is written: a text shorter than two chunks, a source the engine does not run (a Hugging Face
directory), options that write no single GGUF (--dry-run, split outputs), bad --kld-ctx values."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from cases import FIXTURES, make_model  # noqa: E402
from conftest import QUANTD, tiny_hf  # noqa: E402

TEXT = os.path.join(FIXTURES, "text.txt")  # 2,068 tokens
CTX, CHUNKS = 64, 8


def quantd(*args, cwd=None, check=True):
    p = subprocess.run([QUANTD, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def last_json(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model("llama-gqa", tmp_path_factory.mktemp("kld") / "llama-gqa.gguf")


def test_convert_kld_equals_perplexity_by_hand(model, tmp_path):
    out = tmp_path / "q4_0.gguf"
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    p = subprocess.run([QUANTD, "convert", "--in", model, "--out", out, "--recipe", "Q4_0", "--kld", TEXT,
                        "--kld-ctx", str(CTX), "--kld-chunks", str(CHUNKS)], capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(env_tmp)})
    assert p.returncode == 0, p.stderr
    s = last_json(p)["summary"]
    k = s["kld"]
    assert os.listdir(env_tmp) == []  # the source's log-probabilities are a temporary
    # by hand: the source's base file, then the output against it
    base = tmp_path / "base.kld"
    src = last_json(quantd("perplexity", "-m", model, "-f", TEXT, "-c", CTX, "--chunks", CHUNKS,
                           "--kl-divergence-base", base))
    ref = last_json(quantd("perplexity", "-m", out, "--kl-divergence-base", base, "--kl-divergence"))
    assert (k["text"], k["n_ctx"], k["chunks"]) == (TEXT, CTX, CHUNKS)
    assert k["tokens_scored"] == ref["tokens_scored"] == CHUNKS * (CTX - 1 - CTX // 2)
    # the same engine over the same tokens: the same figures, to the bit
    compared = 0
    for key, want in ref["kld"].items():
        assert k[key] == want, (key, k[key], want)
        compared += 1
    assert compared >= 8 and {"mean", "mean_error", "median"} <= set(ref["kld"])
    assert k["ppl"] == ref["ppl"] and k["delta_p"] == ref["delta_p"]
    assert (k["same_top_p"], k["same_top_p_error"]) == (ref["same_top_p"], ref["same_top_p_error"])
    # the source's perplexity from its base file, its own run's within its float rounding
    assert abs(k["ppl"]["base"] - src["ppl"]) / src["ppl"] < 1e-3
    # a real divergence: Q4_0 of N(0, 0.02) weights moves the distribution, not wildly
    assert 0 < k["mean"] < 1 and 0.3 < k["same_top_p"] <= 1
    assert s["recipe"] == "Q4_0" and s["quantized"] > 0  # the rest of the summary as it was


def test_convert_kld_refusals(model, tmp_path):
    out = tmp_path / "o.gguf"
    # a text shorter than two chunks: refused before anything is written
    p = quantd("convert", "--in", model, "--out", out, "--recipe", "Q4_0", "--kld", TEXT, "--kld-ctx", "2048",
               check=False)
    assert p.returncode == 1 and "at least 4096" in p.stderr and "--kld-ctx" in p.stderr, p.stderr
    assert not out.exists()
    # a Hugging Face directory: the engine runs GGUF files only
    hf = tiny_hf(tmp_path / "hf")
    p = quantd("convert", "--in", hf, "--out", tmp_path / "nf4", "--fmt", "nf4", "--kld", TEXT, check=False)
    assert p.returncode == 2 and "GGUF" in p.stderr and "directory" in p.stderr, p.stderr
    assert not (tmp_path / "nf4").exists()
    # options that write no single GGUF
    for extra, says in ((["--dry-run"], "--dry-run"), (["--split-max-tensors", "4"], "--split-max-tensors")):
        p = quantd("convert", "--in", model, "--out", out, "--recipe", "Q4_0", "--kld", TEXT, *extra, check=False)
        assert p.returncode == 2 and says in p.stderr and "one output" in p.stderr, p.stderr
    for flag, v in (("--kld-ctx", "3"), ("--kld-chunks", "0"), ("--kld-ctx", "x")):
        p = quantd("convert", "--in", model, "--out", out, "--recipe", "Q4_0", "--kld", TEXT, flag, v, check=False)
        assert p.returncode == 2 and flag in p.stderr, p.stderr
    # a missing text
    p = quantd("convert", "--in", model, "--out", out, "--recipe", "Q4_0", "--kld", tmp_path / "none.txt", check=False)
    assert p.returncode == 1 and "none.txt" in p.stderr, p.stderr
    assert not out.exists()
