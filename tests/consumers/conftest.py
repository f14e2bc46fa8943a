"""Shared by the runtime tests: the quantd binary, running it, a directory's safetensors as torch
tensors."""
import os
import subprocess
import sys

QUANTD = os.environ.get("QUANTD", os.path.join(os.path.dirname(__file__), "..", "..", "bin", "quantd"))

# llm-compressor's integer codes are those of compressed-tensors' Triton kernel on CUDA; without
# CUDA the tests run that kernel in Triton's interpreter, which must be chosen before anything
# imports triton (tests/fixtures/ct_triton.py)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
try:
    import ct_triton
    ct_triton.prepare()
except ImportError:  # no torch here: the tests that need it are skipped
    pass


def torch_tensors(d):
    """Every tensor of the .safetensors files of a directory, by name (torch; torch must be there)."""
    from safetensors import safe_open
    out = {}
    for fn in os.listdir(d):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
    return out


def run_quantd(*args, check=True):
    p = subprocess.run([QUANTD, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"quantd {' '.join(map(str, args))} failed: {p.stderr}")
    return p
