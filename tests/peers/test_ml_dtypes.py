"""Element conversions of kernels/fp.h against ml_dtypes, on a dense sample of f32 values:
every exponent with a spread of mantissas, and every rounding midpoint of each target type
with its neighbours one and two ulps away."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

from conftest import call_array

KINDS = {  # kind index in kernels/mx.h, ml_dtypes type, largest finite value
    "e2m1": (0, ml_dtypes.float4_e2m1fn, 6.0),
    "e2m3": (1, ml_dtypes.float6_e2m3fn, 7.5),
    "e3m2": (2, ml_dtypes.float6_e3m2fn, 28.0),
    "e4m3fn": (3, ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (4, ml_dtypes.float8_e5m2, 57344.0),
}


def dense_sample(mltype):
    rng = np.random.default_rng()
    hi = np.arange(1 << 16, dtype=np.uint32) << 16           # every exponent / top mantissa
    lo = rng.integers(0, 1 << 16, size=hi.size, dtype=np.uint32)
    x = (hi | lo).view(np.float32)
    # every representable value of the target, the midpoints between them, and 1-2 ulp around
    codes = np.arange(256, dtype=np.uint8).view(mltype).astype(np.float32)
    vals = np.unique(codes[np.isfinite(codes)])
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    near = np.concatenate([vals, mids])
    bits = near.view(np.uint32).astype(np.int64)
    around = np.concatenate([bits + d for d in (-2, -1, 0, 1, 2)]).clip(0, 0xFFFFFFFF).astype(np.uint32)
    y = around.view(np.float32)
    out = np.concatenate([x, y, -y])
    return out[np.isfinite(out)]


@pytest.mark.parametrize("name", list(KINDS))
def test_encode_matches_ml_dtypes_after_saturation(fpconv, name):
    kind, mltype, maxv = KINDS[name]
    x = dense_sample(mltype)
    fn = lambda a, o, n: fpconv.qd_test_encode(ctypes.c_int(kind), a, o, n)
    ours = call_array(fn, x, np.uint8)
    # quantd saturates (torchao clamps to the largest value before converting)
    ref = np.clip(x, -maxv, maxv).astype(mltype).view(np.uint8)
    if name in ("e2m1", "e2m3", "e3m2"):  # sub-byte codes sit in the low bits of the byte
        ref = ref & (0x0F if name == "e2m1" else 0x3F)
    bad = np.nonzero(ours != ref)[0]
    assert bad.size == 0, f"{name}: {bad.size} mismatches, first x={x[bad[0]]!r} ours={ours[bad[0]]:#x} ml_dtypes={ref[bad[0]]:#x}"


@pytest.mark.parametrize("name", list(KINDS))
def test_decode_every_code(fpconv, name):
    kind, mltype, _ = KINDS[name]
    nbits = {"e2m1": 4, "e2m3": 6, "e3m2": 6}.get(name, 8)
    codes = np.arange(1 << nbits, dtype=np.uint8)
    fn = lambda a, o, n: fpconv.qd_test_decode(ctypes.c_int(kind), a, o, n)
    ours = call_array(fn, codes, np.float32)
    ref = codes.view(mltype).astype(np.float32)
    both_nan = np.isnan(ours) & np.isnan(ref)
    assert np.array_equal(ours.view(np.uint32)[~both_nan], ref.view(np.uint32)[~both_nan])
    assert np.array_equal(np.isnan(ours), np.isnan(ref))


def test_e8m0_decode_every_code(fpconv):
    codes = np.arange(256, dtype=np.uint8)
    ours = call_array(fpconv.qd_test_e8m0_decode, codes, np.float32)
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(ours[ok].view(np.uint32), ref[ok].view(np.uint32))


def test_e8m0_rceil_is_smallest_power_of_two_at_or_above(fpconv):
    rng = np.random.default_rng()
    x = np.concatenate([
        np.ldexp(np.float32(1), np.arange(-126, 128)).astype(np.float32),
        (rng.random(200000) * 1e6).astype(np.float32),
        (rng.random(200000) * 1e-30).astype(np.float32),
    ])
    ours = call_array(fpconv.qd_test_e8m0_rceil, x, np.uint8)
    up = ours.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    assert np.all(up >= x)
    assert np.all(up / 2 < x)
    # exact powers of two convert to themselves, as ml_dtypes converts them
    pw = x[:254]
    assert np.array_equal(ours[:254], pw.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))


def test_f16_and_bf16_round_to_nearest_even(fpconv):
    rng = np.random.default_rng()
    x = rng.integers(0, 1 << 32, size=4_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.float32([65504, 65519.996, 65520, 2.0**-25, 2.0**-24, 3 * 2.0**-26])])
    with np.errstate(over="ignore"):  # numpy's own overflow to inf is the expected result
        ref16 = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(call_array(fpconv.qd_test_f16, x, np.uint16), ref16)
    assert np.array_equal(call_array(fpconv.qd_test_bf16, x, np.uint16),
                          x.astype(ml_dtypes.bfloat16).view(np.uint16))
    h = np.arange(1 << 16, dtype=np.uint16)
    back = call_array(fpconv.qd_test_f16_to_f32, h, np.float32)
    ref = h.view(np.float16).astype(np.float32)
    fin = np.isfinite(ref) | np.isinf(ref)
    assert np.array_equal(back[fin].view(np.uint32), ref[fin].view(np.uint32))
