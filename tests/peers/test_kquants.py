"""K-quants (q2_K ... q6_K) against llama.cpp: quantd convert of the exact hard-case models
(tests/checkpoint/tiny_gguf.py --cases) gives, tensor for tensor, the bytes and types that
llama-quantize --pure (and, with --recipe, llama-quantize's mixes) wrote for the same inputs (tests/fixtures/kquants, made by
tests/fixtures/make_kquant_fixtures.py), fallbacks included; quantd's dequantization equals the
gguf package's numpy port of dequantize_row_*, on fresh random rows."""
import hashlib
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from conftest import FIXTURES, ROOT, component, quantize, run_quantd

TYPES = {"q2_K": T.Q2_K, "q3_K": T.Q3_K, "q4_K": T.Q4_K, "q5_K": T.Q5_K, "q6_K": T.Q6_K}
TINY = os.path.join(ROOT, "tests", "checkpoint", "tiny_gguf.py")
with open(os.path.join(FIXTURES, "kquants", "llama_quantize.json")) as f:
    FIX = json.load(f)
REF, MIXES, MIX_MODELS = FIX["cases"], FIX["mixes"], FIX["mix_models"]


def hashes(path):
    return {t.name: f"{t.tensor_type.name}:{hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()[:16]}"
            for t in gguf.GGUFReader(str(path)).tensors}


def same(ours, ref):
    differ = sorted(n for n in ref if ours.get(n) != ref[n])
    assert not differ and set(ours) == set(ref), \
        f"{len(differ)} tensors differ: " + ", ".join(f"{n} {ours.get(n)} vs {ref[n]}" for n in differ[:4])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("kq")
    made = {}
    for key in REF:
        dt, ffn, _ = key.split("/")
        if (dt, ffn) not in made:
            p = d / f"{dt}_{ffn}.gguf"
            subprocess.run([sys.executable, TINY, str(p), dt, "--cases", "--ffn", ffn], check=True)
            made[(dt, ffn)] = p
    return made


@pytest.mark.parametrize("key", sorted(REF))
def test_convert_equals_llama_quantize_pure(inputs, tmp_path, key):
    dt, ffn, qtype = key.split("/")
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", inputs[(dt, ffn)], "--out", out, "--fmt", qtype.replace("Q", "q"))
    same(hashes(out), REF[key])


@pytest.fixture(scope="module")
def mix_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    made = {}
    for model, args in MIX_MODELS.items():
        p = d / f"{model}.gguf"
        subprocess.run([sys.executable, TINY, str(p), args[0], "--cases", *args[1:]], check=True)
        made[model] = p
    return made


@pytest.mark.parametrize("key", sorted(MIXES))
def test_recipe_equals_llama_quantize(mix_inputs, tmp_path, key):
    """--recipe Q4_K_M ...: each tensor's type by llama-quantize's rules, and its bytes"""
    model, mix = key.split("/")
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", mix_inputs[model], "--out", out, "--recipe", mix)
    same(hashes(out), MIXES[key])
    assert gguf.GGUFReader(str(out)).fields["general.file_type"].parts[-1][0] == \
        {"Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13,
         "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}[mix]


def test_recipes_mix_types():
    """the fixtures themselves: the mixes do choose several types (else the test above proves little)"""
    kinds = {v.split(":")[0] for v in MIXES["bf16-l16/Q4_K_M"].values()}
    assert {"Q4_K", "Q6_K", "F32"} <= kinds, kinds


def test_unknown_recipe_is_refused(tmp_path):
    p = run_quantd("convert", "--in", "x.gguf", "--out", tmp_path / "o.gguf", "--recipe", "Q7_K", check=False)
    assert p.returncode == 2 and "unknown recipe" in p.stderr and "Q4_K_M" in p.stderr


def rows(shape, seed=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1, 16)[::7] *= np.float32(40.0)   # sub-blocks of outliers
    x.reshape(-1, 16)[3::11] = 0.0               # and of zeros
    return x


@pytest.mark.parametrize("fmt", list(TYPES))
def test_dequantize_matches_gguf(fmt, tmp_path):
    x = rows((4, 1024))
    out, meta = quantize(x.tobytes(), fmt, "f32", x.shape)
    dst = tmp_path / "back.f32"
    run_quantd("dequantize", "--in", out, "--dtype", "f32", "--out", dst)
    ours = np.fromfile(dst, np.float32).reshape(x.shape)
    blob = np.frombuffer(component(out, "data"), np.uint8).reshape(x.shape[0], -1)
    ref = quants.dequantize(blob, TYPES[fmt]).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    # and the codes mean what they should: the error shrinks with the bits
    nmse = float(((ours - x) ** 2).sum() / (x ** 2).sum())
    assert nmse < {"q2_K": 0.2, "q3_K": 0.06, "q4_K": 0.015, "q5_K": 0.004, "q6_K": 0.001}[fmt], nmse


def test_rows_must_hold_whole_super_blocks():
    x = rows((2, 320))
    with pytest.raises(AssertionError, match="multiple of 256"):
        quantize(x.tobytes(), "q4_K", "f32", x.shape)
