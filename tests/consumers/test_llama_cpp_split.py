"""Split GGUF models: quantd convert against llama.cpp's own tools, run here (make test-consumers
builds llama-quantize, llama-gguf-split and llama-completion from the llama-cpp-python sdist and
points LLAMA_CPP_BIN at them; CI compares the recorded hashes instead,
tests/peers/test_gguf_splits.py):
- llama-gguf-split --split cuts tiny models (by tensor count and by size); from the first shard
  `quantd convert --recipe MIX [--keep-split]` writes the files `llama-quantize [--keep-split]`
  writes, byte for byte, and llama-completion runs quantd's split output;
- quantd's --split-max-tensors / --split-max-size output is llama-gguf-split --split of
  llama-quantize's file, llama-gguf-split --merge takes it (and gives what it gives from its own
  shards), and llama-quantize reads it back as the model it was cut from."""
import hashlib
import os
import subprocess
import sys

import pytest

from conftest import QUANTD  # noqa: E402

BIN = os.environ.get("LLAMA_CPP_BIN", "")
CHECKPOINT = os.path.join(os.path.dirname(__file__), "..", "checkpoint")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "llama-quantize")),
                                reason="LLAMA_CPP_BIN is not set (make test-consumers builds llama.cpp)")


def tool(name):
    path = os.path.join(BIN, name)
    assert os.path.exists(path), f"{path} is missing: make test-consumers builds it"
    return path


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def files(d):
    return {p.name: sha256(p) for p in sorted(d.iterdir())}


def run(*argv, cwd=None):
    p = subprocess.run([str(a) for a in argv], capture_output=True, cwd=cwd)
    assert p.returncode == 0, (argv, p.stderr[-2000:])
    return p


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """name -> the first shard of a model cut by llama-gguf-split."""
    d = tmp_path_factory.mktemp("split")
    models = {"llama": ["tiny_gguf.py", "f16", "--cases"],
              "deep": ["tiny_gguf.py", "bf16", "--layers", "16", "--heads", "8", "--kv-heads", "2"],
              "qwen3moe": ["tiny_gguf_arch.py", "qwen3moe", "bf16"]}
    cuts = {"llama": ["--split-max-tensors", "7"], "deep": ["--split-max-size", "1M"],
            "qwen3moe": ["--split-max-tensors", "10"]}
    out = {}
    for name, (script, *args) in models.items():
        src = d / f"{name}.gguf"
        run(sys.executable, os.path.join(CHECKPOINT, script), src, *args)
        run(tool("llama-gguf-split"), "--split", *cuts[name], src, d / name)
        out[name] = sorted(d.glob(f"{name}-*-of-*.gguf"))[0]
        out[name + ".whole"] = src
    return out


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("model,mix", [("llama", "Q4_K_M"), ("deep", "Q3_K_M"), ("deep", "IQ4_XS"),
                                       ("qwen3moe", "Q2_K"), ("qwen3moe", "Q4_K_S"), ("llama", "Q8_0")])
def test_split_input_equals_llama_quantize(splits, tmp_path, model, mix, keep):
    ref, ours = tmp_path / "ref", tmp_path / "ours"
    ref.mkdir()
    ours.mkdir()
    opt = ["--keep-split"] if keep else []
    run(tool("llama-quantize"), *opt, splits[model], ref / "out.gguf", mix, "2")
    run(QUANTD, "convert", "--in", splits[model], "--out", ours / "out.gguf", *opt, "--recipe", mix)
    assert files(ours) == files(ref)
    if keep:  # llama.cpp loads the split it wrote from its first shard
        first = sorted(ours.iterdir())[0]
        p = subprocess.run([tool("llama-completion"), "-m", str(first), "-p", "the quantize model", "-n", "4",
                            "--temp", "0", "-t", "1", "-no-cnv"], capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]


@pytest.mark.parametrize("cut", [["--split-max-tensors", "5"], ["--split-max-size", "1M"]])
def test_split_output_is_gguf_split(splits, tmp_path, cut):
    src = splits["deep.whole"]
    whole, theirs, ours = tmp_path / "whole.gguf", tmp_path / "theirs", tmp_path / "ours"
    theirs.mkdir()
    ours.mkdir()
    run(tool("llama-quantize"), src, whole, "Q4_K_M", "2")
    run(tool("llama-gguf-split"), "--split", *cut, whole, theirs / "m")
    run(QUANTD, "convert", "--in", src, "--out", ours / "m.gguf", *cut, "--recipe", "Q4_K_M")
    assert files(ours) == files(theirs)
    merged = {}
    for side in (theirs, ours):  # gguf-split --merge takes quantd's shards
        run(tool("llama-gguf-split"), "--merge", sorted(side.glob("m-*.gguf"))[0], tmp_path / f"{side.name}.gguf")
        merged[side.name] = sha256(tmp_path / f"{side.name}.gguf")
    assert merged["ours"] == merged["theirs"]
    # llama-quantize reads quantd's shards as the model: COPY gives llama-quantize's file back
    run(tool("llama-quantize"), "--allow-requantize", sorted(ours.glob("m-*.gguf"))[0], tmp_path / "back.gguf",
        "COPY", "2")
    run(QUANTD, "convert", "--in", sorted(ours.glob("m-*.gguf"))[0], "--out", tmp_path / "back-ours.gguf",
        "--recipe", "COPY")
    assert sha256(tmp_path / "back.gguf") == sha256(tmp_path / "back-ours.gguf")
