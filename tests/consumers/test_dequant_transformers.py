"""quantd convert --fmt bf16|f16|f32 against transformers 5.17's own dequantization (CPU): each
directory quantd writes (compressed-tensors FP8_DYNAMIC, FP8_BLOCK, W8A8, W4A16, W4A16_ASYM,
W8A16, NVFP4A16, MXFP4A16; FineGrainedFP8) is loaded by transformers with dequantize=True in the
output's dtype (compressed-tensors' decompress; FineGrainedFP8's Fp8Dequantize), a
transformers + bitsandbytes 4-bit one (nf4, fp4, with and without double quant) is loaded and
then model.dequantize(dtype) (bitsandbytes 0.50's dequantize_4bit on the CPU, then the cast), and
every weight quantd writes back equals the model's parameter bit for bit. The save transformers
makes of that model is not the reference for the weights: FineGrainedFP8's save quantizes them
again (and both keep the scale tensors); its config.json is, and
tests/peers/test_convert_dequant.py checks it. Architectures whose tiny models transformers loads
in every layout on a CPU (docs/convert.md)."""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from conftest import run_quantd, torch_tensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
import tiny_hf  # noqa: E402

ARCHS = ["llama", "qwen3", "phi3", "gemma2"]
LAYOUTS = {"FP8_DYNAMIC": ["--fmt", "fp8_e4m3"],
           "FP8_BLOCK": ["--fmt", "fp8_e4m3", "--param", "granularity=block"],
           "W8A8": ["--fmt", "w8a8"],
           "FineGrainedFP8": ["--fmt", "fp8_e4m3", "--param", "flow=transformers"],
           "W4A16": ["--fmt", "w4a16"],
           "W8A16": ["--fmt", "w8a16"],
           "W4A16_ASYM": ["--fmt", "w4a16", "--param", "symmetric=false"],
           "NVFP4A16": ["--fmt", "nvfp4"],
           "MXFP4A16": ["--fmt", "mxfp4"],
           "nf4": ["--fmt", "nf4"],
           "fp4": ["--fmt", "fp4"],
           "nf4-single": ["--fmt", "nf4", "--param", "double_quant=false"],
           "fp4-single": ["--fmt", "fp4", "--param", "double_quant=false"]}
BNB = ("nf4", "fp4", "nf4-single", "fp4-single")
# transformers keeps a decompressed NVFP4/MXFP4 weight in the checkpoint's dtype (bf16) whatever
# dtype it is asked for: bf16 is the comparison there
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    made = {}

    def get(arch, layout):
        if (arch, layout) not in made:
            d = tmp_path_factory.mktemp(f"{arch}_{layout}")
            with open(os.path.join(HERE, "..", "fixtures", "arch", arch + ".json")) as f:
                tiny_hf.write_arch(json.load(f)["source"], d / "src")
            run_quantd("convert", "--in", d / "src", "--out", d / "q", "--backend", "cpu", *LAYOUTS[layout])
            made[arch, layout] = d / "q"
        return made[arch, layout]
    return get


CASES = [(a, l, t) for a in ARCHS for l in LAYOUTS for t in DTYPES if "FP4" not in l or t == "bf16"]


@pytest.mark.parametrize("arch,layout,to", CASES, ids=[f"{a}-{l}-{t}" for a, l, t in CASES])
def test_equals_transformers_dequantized(tmp_path, quantized, arch, layout, to):
    q = quantized(arch, layout)
    if layout in BNB:  # bitsandbytes: loaded quantized, then transformers' dequantize in that dtype
        pytest.importorskip("bitsandbytes")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(q), dtype=DTYPES[to])
        model = model.dequantize(dtype=DTYPES[to])
    else:
        config = (transformers.FineGrainedFP8Config(dequantize=True) if layout == "FineGrainedFP8"
                  else transformers.CompressedTensorsConfig(run_compressed=False))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(q), quantization_config=config,
                                                                  dtype=DTYPES[to])
    params = model.state_dict()
    run_quantd("convert", "--in", q, "--out", tmp_path / "back", "--fmt", to, "--backend", "cpu")
    ours = torch_tensors(tmp_path / "back")
    source = torch_tensors(q)
    if layout in BNB:  # <m>.weight with its quant_state beside it
        quantized_weights = [k[:k.index(".quant_state.")] for k in source if ".quant_state.bitsandbytes__" in k]
    else:
        quantized_weights = [k[:k.rindex(".weight_scale")] + ".weight" for k in source
                             if k.endswith(("weight_scale", "weight_scale_inv"))]
    assert not any(k.endswith(("_packed", "_global_scale", "_shape", "_zero_point", ".absmax", "quant_map"))
                   or "quant_state" in k or "weight_scale" in k for k in ours)
    for w in quantized_weights:
        assert ours[w].dtype == params[w].dtype and torch.equal(ours[w], params[w]), w
    assert quantized_weights
