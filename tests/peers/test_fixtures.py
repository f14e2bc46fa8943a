"""quantd against the fixture vectors the peers produced (tests/fixtures, tests/README.md):
bitsandbytes on CUDA, torchao (MX, NVFP4), AutoAWQ's arithmetic, llm-compressor and transformers
(compressed-tensors integers and FP4, FP8, W8A8). Every component byte for
byte; bitsandbytes' dequantized output too."""
import hashlib
import json
import os

import numpy as np
import pytest

from conftest import FIXTURES, component, quantize, run_quantd


def cases(family):
    d = os.path.join(FIXTURES, family)
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def load(family, case):
    d = os.path.join(FIXTURES, family, case)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(d, "input.bin"), "rb") as f:
        x = f.read()
    return d, meta, x


def expect(d, name):
    with open(os.path.join(d, name + ".bin"), "rb") as f:
        return f.read()


def check_components(d, meta, out):
    for name in meta["components"]:
        if name == "per_tensor_scale":
            continue
        ours, ref = component(out, name), expect(d, name)
        if ours != ref:
            a, b = np.frombuffer(ours, np.uint8), np.frombuffer(ref, np.uint8)
            n = min(a.size, b.size)
            first = int(np.nonzero(a[:n] != b[:n])[0][0]) if np.any(a[:n] != b[:n]) else n
            raise AssertionError(f"{name}: {np.count_nonzero(a[:n] != b[:n])} bytes differ "
                                 f"(sizes {a.size}/{b.size}), first at byte {first}")


@pytest.mark.parametrize("case", cases("bnb"))
def test_bitsandbytes_cuda_bytes(case, tmp_path):
    d, meta, x = load("bnb", case)
    out, got = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], meta["params"], str(tmp_path))
    check_components(d, meta, out)
    back = tmp_path / "back.bin"
    run_quantd("dequantize", "--in", out, "--dtype", meta["dtype"], "--out", back)
    assert back.read_bytes() == expect(d, "dequantized"), "dequantize differs from bitsandbytes"


@pytest.mark.parametrize("case", [c for c in cases("bnb") if "_dq_" in c])
def test_bitsandbytes_offset_computed_within_an_ulp(case, tmp_path):
    """Without a pinned offset quantd computes mean(absmax) itself; torch's CUDA mean may
    differ in the last bit, so only the offset is compared (to one ulp)."""
    d, meta, x = load("bnb", case)
    params = {k: v for k, v in meta["params"].items() if k != "offset"}
    out, got = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], params, str(tmp_path))
    ours, ref = np.float32(got["params"]["offset"]), np.float32(meta["params"]["offset"])
    assert abs(int(ours.view(np.int32)) - int(ref.view(np.int32))) <= 1
    assert component(out, "data") == expect(d, "data")


@pytest.mark.parametrize("case", cases("mx"))
def test_torchao_mx_bytes(case, tmp_path):
    d, meta, x = load("mx", case)
    out, _ = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], meta["params"], str(tmp_path))
    check_components(d, meta, out)


@pytest.mark.parametrize("case", cases("nvfp4"))
def test_torchao_nvfp4_bytes(case, tmp_path):
    d, meta, x = load("nvfp4", case)
    out, got = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], meta["params"], str(tmp_path))
    check_components(d, meta, out)
    if "per_tensor_scale" in meta["components"]:
        ref = np.frombuffer(expect(d, "per_tensor_scale"), np.float32)[0]
        assert np.float32(got["params"]["per_tensor_scale"]) == ref


@pytest.mark.parametrize("case", cases("awq"))
def test_autoawq_bytes(case, tmp_path):
    """AutoAWQ's own _apply_quant (f16 flow) on CUDA; where its f16 arithmetic overflows (it
    asserts, or casts inf to int) quantd refuses with the group named."""
    d, meta, x = load("awq", case)
    if meta.get("quantd_refuses"):
        src = tmp_path / "input.bin"
        src.write_bytes(x)
        p = run_quantd("quantize", "--fmt", "awq", "--dtype", meta["dtype"], "--shape",
                       ",".join(map(str, meta["shape"])), "--in", src, "--out", tmp_path / "out",
                       "--param", f"group_size={meta['params']['group_size']}", check=False)
        assert p.returncode != 0 and "overflows f16" in p.stderr, p.stderr
        return
    out, _ = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], meta["params"], str(tmp_path))
    check_components(d, meta, out)


@pytest.mark.parametrize("case", cases("ct"))
def test_compressed_tensors_bytes(case, tmp_path):
    """llm-compressor's own W4A16 / W4A16_ASYM / W8A16 / NVFP4A16 / MXFP4A16 oneshot, as
    compressed-tensors saves it; the FP4 ones also dequantize to what its decompressor gives (bf16)"""
    d, meta, x = load("ct", case)
    out, _ = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], meta["params"], str(tmp_path))
    check_components(d, meta, out)
    back = tmp_path / "back.bin"  # and it dequantizes (in the weight's dtype) to what the codes mean
    run_quantd("dequantize", "--in", out, "--dtype", meta["dtype"], "--out", back)
    assert back.stat().st_size == len(x)
    if os.path.exists(os.path.join(d, "dequantized.bin")):
        run_quantd("dequantize", "--in", out, "--dtype", "bf16", "--out", back)
        assert back.read_bytes() == expect(d, "dequantized"), "dequantize differs from compressed-tensors"


@pytest.mark.parametrize("case", cases("fp8"))
def test_fp8_and_w8a8_bytes(case, tmp_path):
    """llm-compressor's own FP8_DYNAMIC / FP8 (weights) / FP8_BLOCK / W8A8 oneshot as compressed-tensors
    saves it, and transformers' FineGrainedFP8 ops; dequantized to each dtype as the peer's own
    dequantization gives it (compressed-tensors' decompressor, transformers' Fp8Dequantize)"""
    d, meta, x = load("fp8", case)
    out, _ = quantize(x, meta["fmt"], meta["dtype"], meta["shape"], meta["params"], str(tmp_path))
    check_components(d, meta, out)
    for dtype, want in sorted(meta["dequantized_sha256"].items()):
        back = tmp_path / f"back.{dtype}"
        run_quantd("dequantize", "--in", out, "--dtype", dtype, "--out", back)
        assert hashlib.sha256(back.read_bytes()).hexdigest() == want, f"dequantize to {dtype} differs from the peer's"


def test_every_family_has_fixtures():
    for fam in ("bnb", "mx", "nvfp4", "awq", "ct", "fp8"):
        assert cases(fam), f"no fixtures for {fam}"
