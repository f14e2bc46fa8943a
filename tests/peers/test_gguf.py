"""GGML blocks byte for byte against llama.cpp's quantizers as the gguf package implements them
(gguf/quants.py mirrors ggml-quants.c's quantize_row_*_ref), on fresh random rows."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from conftest import bf16_bytes, component, quantize, run_quantd

TYPES = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0}


def rows(shape, kind):
    rng = np.random.default_rng()
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "structured":
        flat = x.reshape(-1, 32)              # blocks, whatever the row length
        specials = [lambda b: np.zeros_like(b),  # zero block (+0.0: see the f16 note below)
                    lambda b: np.where(np.arange(32) == 8, 75.0, b * 1e-3),  # single outlier
                    lambda b: b * 0.0 + 3.0,   # constant block
                    lambda b: -b ** 2,         # one-signed block
                    lambda b: b * tiny,        # tiny (subnormal f16 scales)
                    lambda b: b * 1e4]         # huge
        for i, f in enumerate(specials[:flat.shape[0]]):
            flat[i] = f(flat[i]).astype(np.float32)
    return x


tiny = np.float32(1e-30)


@pytest.mark.parametrize("fmt", list(TYPES))
@pytest.mark.parametrize("kind", ["normal", "structured"])
@pytest.mark.parametrize("shape", [(3, 64), (7, 4096), (1, 32)])
def test_f32_matches_gguf(fmt, kind, shape):
    x = rows(shape, kind)
    out, _ = quantize(x.tobytes(), fmt, "f32", shape)
    ref = quants.quantize(x, TYPES[fmt]).tobytes()
    assert component(out, "data") == ref


@pytest.mark.parametrize("fmt", list(TYPES))
def test_bf16_and_f16_inputs_widen_exactly(fmt):
    x = rows((5, 256), "structured")
    # keep the tiny block non-zero in f16: an all-zero f16 block starting with -0.0 is the one
    # case where gguf's numpy port and ggml's C reference disagree (tests/kernels pins the C one)
    x[0, 128:160] = np.float32(1e-4) * np.sign(x[0, 128:160] + 1e-9)
    xb = np.frombuffer(bf16_bytes(x), np.uint16)
    widened = (xb.astype(np.uint32) << 16).view(np.float32).reshape(x.shape)
    out, _ = quantize(xb.tobytes(), fmt, "bf16", x.shape)
    assert component(out, "data") == quants.quantize(widened, TYPES[fmt]).tobytes()
    xh = x.clip(-60000, 60000).astype(np.float16)
    out, _ = quantize(xh.tobytes(), fmt, "f16", x.shape)
    assert component(out, "data") == quants.quantize(xh.astype(np.float32), TYPES[fmt]).tobytes()


@pytest.mark.parametrize("fmt", list(TYPES))
def test_dequantize_matches_gguf(fmt, tmp_path):
    x = rows((4, 512), "normal")
    out, _ = quantize(x.tobytes(), fmt, "f32", x.shape)
    dst = tmp_path / "back.f32"
    run_quantd("dequantize", "--in", out, "--dtype", "f32", "--out", dst)
    ours = np.fromfile(dst, np.float32).reshape(x.shape)
    blob = np.frombuffer(component(out, "data"), np.uint8).reshape(x.shape[0], -1)
    ref = quants.dequantize(blob, TYPES[fmt]).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_q8_1_is_q8_0_plus_scaled_sum():
    """gguf has no Q8_1; quantize_row_q8_1_ref computes d and qs exactly as q8_0's reference and
    adds s = fp16(sum(qs) * d), so those are checked against gguf's Q8_0."""
    x = rows((6, 1024), "normal")
    out, _ = quantize(x.tobytes(), "q8_1", "f32", x.shape)
    ours = np.frombuffer(component(out, "data"), np.uint8).reshape(-1, 36)
    q80 = np.frombuffer(quants.quantize(x, T.Q8_0).tobytes(), np.uint8).reshape(-1, 34)
    assert np.array_equal(ours[:, :2], q80[:, :2])
    assert np.array_equal(ours[:, 4:], q80[:, 2:])
    d = q80[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    d_f32 = (np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)).astype(np.float32)
    qs = q80[:, 2:].view(np.int8).astype(np.int32).sum(axis=1)
    s = (qs.astype(np.float32) * d_f32).astype(np.float16)
    assert np.array_equal(ours[:, 2:4].copy().view(np.float16)[:, 0].view(np.uint16), s.view(np.uint16))
    assert d.size == s.size


@pytest.mark.parametrize("fmt", list(TYPES) + ["q8_1"])
def test_rejects_cols_not_multiple_of_32(fmt, tmp_path):
    x = np.ones((2, 48), np.float32)
    (tmp_path / "x").write_bytes(x.tobytes())
    p = run_quantd("quantize", "--fmt", fmt, "--dtype", "f32", "--shape", "2,48", "--in",
                   tmp_path / "x", "--out", tmp_path / "o", check=False)
    assert p.returncode != 0 and "multiple of 32" in p.stderr
