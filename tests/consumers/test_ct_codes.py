"""quantd quantize --fmt w4a16 / w8a16 against compressed-tensors' own quantization of fresh random
weights (N(0, 0.02), as transformers initializes a Linear; bf16, f16, f32), with planted groups
whose quotients x / scale land on .5 in the weight's dtype but not in f32, and exact f32 ties:
llm-compressor's weight observer (memoryless_minmax) and compressed-tensors' pack-quantized
compressor, as llm-compressor runs them on a CUDA device (its Triton kernel; on a machine
without CUDA the same kernel in Triton's interpreter: tests/fixtures/ct_triton.py). Every
component must be identical. The planted groups are checked to reach codes that eager torch
(the path llm-compressor takes without CUDA) computes differently, so the test can fail."""
import json
import subprocess
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
pytest.importorskip("llmcompressor")

import ct_triton  # noqa: E402  (tests/fixtures, put on the path by conftest)
from conftest import QUANTD  # noqa: E402

ct_triton.install()

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402
from llmcompressor.observers import Observer  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
FMT = {"W4A16": "w4a16", "W4A16_ASYM": "w4a16", "W8A16": "w8a16"}


def planted(w, args, gen):
    """Rows 0-7 of w: groups of .5 quotients (as make_ct_fixtures.py's half_group): their extremes,
    then values next to (k + 0.5 - zero_point) * scale that round onto .5 in the dtype only, or
    are .5 exactly in f32, in random order."""
    dt, gs = w.dtype, args.group_size
    lo, hi = -(1 << (args.num_bits - 1)), (1 << (args.num_bits - 1)) - 1
    ints = torch.int32 if dt == torch.float32 else torch.int16
    for r in range(8):
        for c in range(0, w.shape[1], gs):
            mx = (0.02 * (2 + 3 * torch.rand(1, generator=gen))).to(dt)
            mn = (-mx.float() * (0.9 if args.symmetric else 0.3)).to(dt)
            scale, zp = calculate_qparams(mn, mx, args)
            vals = []
            for k in range(lo, hi):
                x0 = torch.tensor([(k + 0.5 - zp.item()) * scale.item()], dtype=torch.float64).to(dt)
                for j in range(-6, 7):
                    x = (x0.view(ints) + j).view(dt)
                    q32 = x.float() / scale.float() + zp.float()
                    qdt = x / scale + zp.to(dt)
                    on_dt = bool(qdt - torch.floor(qdt) == 0.5) and bool(q32 - torch.floor(q32) != 0.5)
                    if mn <= x <= mx and (on_dt or bool(q32 - torch.floor(q32) == 0.5)):
                        vals.append(x)
                        break
            vals = torch.cat(vals)[torch.randperm(len(vals), generator=gen)]
            w[r, c:c + gs] = torch.cat([mx, mn, vals.repeat(gs // vals.numel() + 1)])[:gs]


def peer(w, scheme, device):
    """compressed-tensors' components for w, the way llm-compressor computes them."""
    args = preset_name_to_scheme(scheme, ["Linear"]).weights
    w = w.to(device)
    obs = Observer.load_from_registry("memoryless_minmax", base_name="weight", args=args)
    obs(w)
    q = obs.get_qparams()
    sd = {"weight": w, "weight_scale": q["scale"].to(w.dtype), "weight_zero_point": q["zero_point"]}
    out = PackedQuantizationCompressor.compress(sd, preset_name_to_scheme(scheme, ["Linear"]))
    return {k: v.cpu().contiguous() for k, v in out.items() if k.startswith("weight_") and k != "weight_shape"}


def eager_codes(w, scale, zp, args):
    """The codes eager torch computes (the quotient rounded to the weight's dtype first)."""
    lo, hi = -(1 << (args.num_bits - 1)), (1 << (args.num_bits - 1)) - 1
    g = w.unflatten(-1, (-1, args.group_size))
    q = g / scale.unsqueeze(-1) + zp.to(w.dtype).unsqueeze(-1)
    return torch.round(torch.clamp(q, lo, hi)).flatten(1)


@pytest.mark.parametrize("scheme", sorted(FMT))
@pytest.mark.parametrize("dt", sorted(DT))
def test_quantd_equals_compressed_tensors_on_fresh_weights(tmp_path, scheme, dt):
    args = preset_name_to_scheme(scheme, ["Linear"]).weights
    gen = torch.Generator().manual_seed(zlib.crc32(f"{scheme} {dt}".encode()))
    w = (torch.randn(96, 512, generator=gen) * 0.02).to(DT[dt])
    planted(w, args, gen)
    device = "cuda" if ct_triton.MODE == "cuda" else "cpu"
    ref = peer(w.clone(), scheme, device)
    src = tmp_path / "w.bin"
    w.view(torch.uint8).numpy().tofile(src)
    cmd = [QUANTD, "quantize", "--fmt", FMT[scheme], "--dtype", dt, "--shape", "96,512", "--in", src,
           "--out", tmp_path / "q", "--param", f"symmetric={str(args.symmetric).lower()}", "--no-report"]
    subprocess.run(list(map(str, cmd)), check=True, capture_output=True)
    meta = json.load(open(tmp_path / "q" / "meta.json"))
    assert sorted(meta["components"]) == sorted(ref)
    for name, t in ref.items():
        ours = np.fromfile(tmp_path / "q" / f"{name}.bin", np.uint8)
        theirs = t.view(torch.uint8).numpy().ravel()
        assert ours.size == theirs.size and np.array_equal(ours, theirs), \
            f"{name}: {np.count_nonzero(ours != theirs)} bytes differ"
    if dt != "f32":  # the planted groups reach codes eager torch gets wrong
        scale = ref["weight_scale"]
        zp = torch.zeros_like(scale, dtype=torch.int8)
        if not args.symmetric:
            z = ref["weight_zero_point"].view(torch.int32)  # packed along the rows, as bits-wide codes
            per = 32 // args.num_bits
            zp = torch.stack([((z >> (args.num_bits * i)) & ((1 << args.num_bits) - 1)) for i in range(per)], 1)
            zp = (zp.reshape(-1, zp.shape[-1])[:w.shape[0]] - (1 << (args.num_bits - 1))).to(torch.int8)
        cuda = torch.round(torch.clamp(w.float().unflatten(-1, (-1, args.group_size)) / scale.float().unsqueeze(-1)
                                       + zp.float().unsqueeze(-1), -(1 << (args.num_bits - 1)),
                                       (1 << (args.num_bits - 1)) - 1)).flatten(1)
        differ = (cuda != eager_codes(w, scale, zp, args).float())
        assert differ[:8].sum() > 0, "no planted code differs from eager torch's"
        print(f"{scheme} {dt}: {int(differ.sum())} codes differ from eager torch's, "
              f"{int(differ[:8].sum())} in the planted rows")
