"""quantd's MLX formats against mlx itself: mx.quantize and mx.dequantize of mlx 0.32.4 on its CPU
backend (the mlx[cpu] wheel), byte for byte, on seeded tensors of hard groups (zeros, one outlier,
constants, ~1e-6, all negative, ramps, ties of the code grids, subnormals, values near the
dtype's largest, -0.0) with an odd row count, for every mode, bits, group size and input dtype,
and every output dtype of the dequantize."""
import os
import tempfile

import numpy as np
import pytest

try:
    import mlx.core as mx
except ImportError as e:  # a missing peer is a failure, never a skip
    raise ImportError("tests/peers/test_mlx.py needs mlx[cpu]==0.32.4 in the test venv "
                      "(tests/requirements.txt lists it: run 'make venv')") from e
import ml_dtypes

from conftest import quantize, run_quantd

MLX_VERSION = "0.32.4"
DTYPES = {"f32": (np.float32, mx.float32), "f16": (np.float16, mx.float16),
          "bf16": (ml_dtypes.bfloat16, mx.bfloat16)}
BIG = {"f32": 3.0e38, "f16": 65504.0, "bf16": 3.0e38}
TINY = {"f32": 1e-40, "f16": 1e-7, "bf16": 1e-40}  # subnormal in each dtype
ROWS, COLS = 15, 256  # an odd row count; 256 columns hold 2-8 groups of every size


def hard_rows(rng, dt, group):
    """ROWS x COLS f32 values (exact in dtype dt) whose groups are the hard cases, one kind per
    row and, in the last rows, a random kind per group."""
    n = COLS
    kinds = [
        lambda: np.zeros(n),
        lambda: np.where(np.arange(n) % group == 5, 50.0, rng.standard_normal(n) * 0.01),  # one outlier per group
        lambda: np.full(n, 3.7),
        lambda: np.full(n, -0.3),
        lambda: rng.standard_normal(n) * 1e-6,
        lambda: -np.abs(rng.standard_normal(n)),
        lambda: np.linspace(-1.0, 1.0, n),
        lambda: np.arange(n) % group * 0.25,                                            # ramps of grid steps
        lambda: rng.integers(-24, 25, n) * 0.25 * 2.0 ** rng.integers(-6, 7),           # E2M1 / affine ties
        lambda: rng.integers(-448, 449, n) * 2.0 ** rng.integers(-12, 2),                 # E4M3 ties
        lambda: rng.standard_normal(n) * TINY[dt],
        lambda: np.clip(rng.standard_normal(n), -1, 1) * BIG[dt],
        lambda: np.where(rng.random(n) < 0.5, -0.0, 0.0) + np.where(np.arange(n) % group == 3, 1e-3, 0.0),
    ]
    x = np.stack([k() for k in kinds])
    mixed = rng.standard_normal((ROWS - len(kinds), n)) * 10.0 ** rng.integers(-3, 4, (ROWS - len(kinds), 1))
    for r in range(mixed.shape[0]):
        for g in range(0, n, group):
            mixed[r, g:g + group] = kinds[rng.integers(len(kinds))]()[g:g + group]
    x = np.concatenate([x, mixed]).astype(np.float32)
    return x.astype(DTYPES[dt][0]).astype(np.float32)  # exact in dt from here on


def to_mx(x32, dt):
    return mx.array(x32).astype(DTYPES[dt][1])  # exact: the values are dt's


def raw(a):
    """An mlx array's bytes (bf16 and f16 through a 16-bit view)."""
    if a.dtype in (mx.bfloat16, mx.float16):
        a = a.view(mx.uint16)
    return np.array(a).tobytes()


def input_bytes(x32, dt):
    return x32.astype(DTYPES[dt][0]).tobytes()


def quantd_dequantize(out_dir, odt):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "y.bin")
        run_quantd("dequantize", "--in", out_dir, "--dtype", odt, "--out", path)
        with open(path, "rb") as f:
            return f.read()


def same_values(ours, want, odt):
    """Bytes equal, or NaN at the same places (a NaN's payload is the hardware's)."""
    if ours == want:
        return True
    a = np.frombuffer(ours, DTYPES[odt][0]).astype(np.float32)
    b = np.frombuffer(want, DTYPES[odt][0]).astype(np.float32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def check_case(fmt, mode, dt, x32, params=None, mx_kwargs=None, shape=None):
    shape = shape or x32.shape
    out, meta = quantize(input_bytes(x32, dt), fmt, dt, shape, params)
    want = mx.quantize(to_mx(x32.reshape(shape), dt), mode=mode, **(mx_kwargs or {}))
    names = ["weight", "scales", "biases"][:len(want)]
    assert list(meta["components"]) == names
    for name, w in zip(names, want):
        with open(os.path.join(out, name + ".bin"), "rb") as f:
            ours = f.read()
        if ours != raw(w):
            a = np.frombuffer(ours, np.uint8)
            b = np.frombuffer(raw(w), np.uint8)
            at = int(np.nonzero(a != b)[0][0]) if a.size == b.size else -1
            pytest.fail(f"{fmt} {dt} {params}: {name} differs from mx.quantize (first at byte {at})")
    # dequantize to every dtype: mx.dequantize of mlx's own components
    gs = (mx_kwargs or {}).get("global_scale")
    for odt in DTYPES:
        extra = {"global_scale": gs} if gs is not None else {}
        y = mx.dequantize(*want, mode=mode, dtype=DTYPES[odt][1], **extra,
                          **{k: v for k, v in (mx_kwargs or {}).items() if k in ("bits", "group_size")})
        if y.dtype != DTYPES[odt][1]:  # nvfp4 with a global scale answers in f32 whatever is asked
            y = y.astype(DTYPES[odt][1])
        assert same_values(quantd_dequantize(out, odt), raw(y), odt), f"{fmt} {dt} -> {odt} {params}: dequantize differs"
    return out, meta


def test_mlx_is_the_version_the_rules_were_read_from():
    assert mx.__version__ == MLX_VERSION, f"docs/formats.md describes mlx {MLX_VERSION}, the venv has {mx.__version__}"
    assert mx.default_device() == mx.cpu


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
def test_affine_equals_mx_quantize(bits, group, dt):
    for seed in range(3):
        rng = np.random.default_rng(10000 * seed + 100 * bits + group + list(DTYPES).index(dt))
        x = hard_rows(rng, dt, group)
        _, meta = check_case("mlx_affine", "affine", dt, x, {"bits": bits, "group_size": group},
                             {"bits": bits, "group_size": group})
        assert meta["params"]["scale_dtype"] == dt


def replace_components(out, arrays):
    for name, a in arrays.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(a)


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_dequantize_of_any_bytes_equals_mx_dequantize(mode):
    """Every scale byte (255 and 0 too, the E4M3 NaNs 0x7f and 0xff) and random codes: quantd's
    dequantize gives mx.dequantize's values in every output dtype."""
    rng = np.random.default_rng(["mxfp4", "nvfp4", "mxfp8"].index(mode))
    group, bits = (16, 4) if mode == "nvfp4" else (32, 8 if mode == "mxfp8" else 4)
    rows, cols = 64, 4 * group
    out, _ = quantize(np.zeros((rows, cols), np.float32).tobytes(), "mlx_" + mode, "f32", (rows, cols))
    words = rng.integers(0, 2**32, (rows, cols * bits // 32), dtype=np.uint64).astype(np.uint32)
    scales = (np.arange(rows * 4) % 256).astype(np.uint8).reshape(rows, 4)
    replace_components(out, {"weight": words.tobytes(), "scales": scales.tobytes()})
    for odt in DTYPES:
        y = mx.dequantize(mx.array(words), mx.array(scales), mode=mode, dtype=DTYPES[odt][1])
        assert same_values(quantd_dequantize(out, odt), raw(y), odt), f"{mode} -> {odt}"


@pytest.mark.parametrize("dt", list(DTYPES))
def test_affine_dequantize_of_any_codes_equals_mx_dequantize(dt):
    rng = np.random.default_rng(list(DTYPES).index(dt))
    for bits in [1, 2, 3, 4, 5, 6, 8]:
        rows, cols, group = 8, 128, 32
        out, _ = quantize(np.ones((rows, cols), DTYPES[dt][0]).tobytes(), "mlx_affine", dt, (rows, cols),
                          {"bits": bits, "group_size": group})
        words = rng.integers(0, 2**32, (rows, cols * bits // 32), dtype=np.uint64).astype(np.uint32)
        sc = (rng.standard_normal((rows, 4)) * 10.0 ** rng.integers(-8, 4, (rows, 1))).astype(np.float32)
        bi = (rng.standard_normal((rows, 4)) * 10.0 ** rng.integers(-8, 4, (rows, 1))).astype(np.float32)
        sc_mx, bi_mx = to_mx(sc.astype(DTYPES[dt][0]).astype(np.float32), dt), to_mx(bi.astype(DTYPES[dt][0]).astype(np.float32), dt)
        replace_components(out, {"weight": words.tobytes(), "scales": raw(sc_mx), "biases": raw(bi_mx)})
        for odt in DTYPES:
            y = mx.dequantize(mx.array(words), sc_mx, bi_mx, bits=bits, group_size=group, dtype=DTYPES[odt][1])
            assert same_values(quantd_dequantize(out, odt), raw(y), odt), f"{dt} bits={bits} -> {odt}"


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_float_modes_equal_mx_quantize(mode, dt):
    group = 16 if mode == "nvfp4" else 32
    for seed in range(4):
        x = hard_rows(np.random.default_rng(seed * 31 + ["mxfp4", "nvfp4", "mxfp8"].index(mode)), dt, group)
        check_case("mlx_" + mode, mode, dt, x)


@pytest.mark.parametrize("dt", list(DTYPES))
def test_nvfp4_global_scale_equals_mx_quantize(dt):
    rng = np.random.default_rng(77)
    x = hard_rows(rng, dt, 16)
    amax = float(np.abs(x).max())
    # mlx-lm's value (the tensor's amax), one that saturates the E4M3 scales, one that empties them
    for gs in [amax, amax / 1e6, min(amax * 1e6, 3.4e38), 1.0]:
        g = np.float32(gs)
        _, meta = check_case("mlx_nvfp4", "nvfp4", dt, x, {"global_scale": float(g)},
                             {"global_scale": mx.array(g)})
        assert np.float32(meta["params"]["global_scale"]) == g


def test_nd_input_is_its_rows():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3 * 7, 128)) * 2).astype(np.float32)
    check_case("mlx_affine", "affine", "bf16", x, {"bits": 3, "group_size": 32}, {"bits": 3, "group_size": 32},
               shape=(3, 7, 128))
    check_case("mlx_mxfp4", "mxfp4", "f32", x, shape=(3, 7, 128))


def test_quantd_refuses_what_mlx_refuses():
    x = np.ones((4, 96), np.float32)
    cases = [("mlx_affine", {"bits": 7}, {"bits": 7}, "bits"),
             ("mlx_affine", {"group_size": 16}, {"group_size": 16}, "group_size"),
             ("mlx_affine", {}, {}, "multiple of 64")]            # 96 columns, groups of 64
    for fmt, params, mx_kwargs, needle in cases:
        args = ["quantize", "--fmt", fmt, "--dtype", "f32", "--shape", "4,96", "--in", "/dev/null", "--out",
                "/nonexistent"]
        for k, v in params.items():
            args += ["--param", f"{k}={v}"]
        with pytest.raises(ValueError):
            mx.eval(mx.quantize(mx.array(x), **mx_kwargs))
        p = run_quantd(*args, check=False)
        assert p.returncode != 0 and needle in p.stderr, p.stderr
    # nvfp4's packing runs over the whole tensor in units of 32: an odd number of groups is refused
    y = np.ones((3, 16), np.float32)
    with pytest.raises(ValueError):
        mx.eval(mx.quantize(mx.array(y), mode="nvfp4"))
    p = run_quantd("quantize", "--fmt", "mlx_nvfp4", "--dtype", "f32", "--shape", "3,16", "--in", "/dev/null",
                   "--out", "/nonexistent", check=False)
    assert p.returncode != 0 and "multiple of 32" in p.stderr, p.stderr


def test_dequantize_dtype_mlx_returns():
    """What mx.dequantize answers when no dtype is asked (quantd's /dequantize default for each
    format: kernels/registry.c dequant_dtype, tested in tests/kernels/test_mlx.c)."""
    x = to_mx(np.ones((2, 64), np.float32), "f16")
    assert mx.dequantize(*mx.quantize(x)).dtype == mx.float16  # affine: the scales' dtype
    for mode in ["mxfp4", "nvfp4", "mxfp8"]:
        assert mx.dequantize(*mx.quantize(x, mode=mode), mode=mode).dtype == mx.bfloat16
    g = mx.array(np.float32(2.0))
    assert mx.dequantize(*mx.quantize(x, mode="nvfp4", global_scale=g), mode="nvfp4", global_scale=g).dtype == mx.float32
