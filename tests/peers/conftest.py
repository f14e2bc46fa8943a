"""Shared helpers for the peer cross-checks: the quantd binary, the fp.h shim, fixtures."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TINY_HF = os.path.join(ROOT, "tests", "checkpoint", "tiny_hf.py")
NP_DTYPE = {"f32": np.float32, "f16": np.float16}


def run_quantd(*args, check=True):
    p = subprocess.run([QUANTD, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"quantd {' '.join(map(str, args))} failed: {p.stderr}")
    return p


def quantize(x_bytes, fmt, dtype, shape, params=None, tmp=None):
    """Runs bin/quantd quantize on raw bytes; returns (dir, meta)."""
    tmp = tmp or tempfile.mkdtemp(prefix="qd")
    src = os.path.join(tmp, "input.bin")
    with open(src, "wb") as f:
        f.write(x_bytes)
    out = os.path.join(tmp, "out")
    args = ["quantize", "--fmt", fmt, "--dtype", dtype, "--shape", ",".join(map(str, shape)),
            "--in", src, "--out", out]
    for k, v in (params or {}).items():
        args += ["--param", f"{k}={str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else v}"]
    run_quantd(*args)
    with open(os.path.join(out, "meta.json")) as f:
        return out, json.load(f)


def component(out_dir, name):
    with open(os.path.join(out_dir, name + ".bin"), "rb") as f:
        return f.read()


def bf16_bytes(x32):
    """f32 -> bf16 (round to nearest even) raw bytes, the way torch rounds."""
    u = np.asarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.tobytes()


@pytest.fixture(scope="session")
def fpconv():
    lib = os.path.join(ROOT, "build", "tests", "libqdfp.so")
    if not os.path.exists(lib):
        raise AssertionError("build/tests/libqdfp.so missing: run through 'make test'")
    return ctypes.CDLL(lib)


def call_array(fn, x, out_dtype):
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, dtype=out_dtype)
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(x.size))
    return out


def load_safetensors_dir(d):
    """Every tensor of the .safetensors files of a directory, by name (numpy arrays)."""
    import ml_dtypes  # numpy learns bfloat16
    from safetensors import safe_open
    if not hasattr(np, "float8_e4m3fn"):  # safetensors' numpy loader looks F8_E4M3 up there
        np.float8_e4m3fn = ml_dtypes.float8_e4m3fn
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "numpy") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
    return out


def tiny_hf(path, *args):
    """tests/checkpoint/tiny_hf.py's model written at path (args: its options after the directory)."""
    subprocess.run([sys.executable, TINY_HF, str(path), *map(str, args)], check=True)
    return path


def convert_as_recorded(tmp_path, fx, *convert_args, src_file=None):
    """A recorded case's tiny model (tmp_path/hf) through `quantd convert ... ARGS` into tmp_path/q,
    every tensor checked against the record; returns (src, dst). src_file: convert that one file of
    the model into tmp_path/q/model.safetensors instead of the directory."""
    src, dst = tiny_hf(tmp_path / "hf", *fx["tiny_hf"]), tmp_path / "q"
    if src_file:
        os.makedirs(dst)
        run_quantd("convert", "--in", src / src_file, "--out", dst / "model.safetensors", *convert_args)
    else:
        run_quantd("convert", "--in", src, "--out", dst, *convert_args)
    assert_tensors_as_recorded(load_safetensors_dir(dst), fx["tensors"])
    return src, dst


def assert_tensors_as_recorded(ours, want):
    """ours (name -> array) has exactly the recorded tensors: names, dtypes, shapes and the
    sha256 of the bytes (a fixture made by the peer: tests/fixtures/make_*_convert_fixtures.py)."""
    import hashlib
    assert sorted(ours) == sorted(want)
    for name, w in want.items():
        t = ours[name]
        assert str(t.dtype) == w["dtype"], name
        assert list(t.shape) == w["shape"], name
        assert hashlib.sha256(np.ascontiguousarray(t).tobytes()).hexdigest() == w["sha256"], name
