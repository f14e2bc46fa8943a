"""K-quants (q2_K ... q6_K) against llama.cpp: quantd convert of the exact hard-case models
(tests/checkpoint/tiny_gguf.py --cases) gives, tensor for tensor, the bytes and types that
llama-quantize --pure wrote for the same inputs (tests/fixtures/kquants, made by
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
    REF = json.load(f)["cases"]


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
    ours = {t.name: [t.tensor_type.name, hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()]
            for t in gguf.GGUFReader(str(out)).tensors}
    differ = sorted(n for n in REF[key] if ours.get(n) != REF[key][n])
    assert not differ and set(ours) == set(REF[key]), f"{len(differ)} tensors differ: {differ[:5]}"


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
