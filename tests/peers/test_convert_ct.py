"""quantd convert --fmt w4a16 / w8a16 / nvfp4 / mxfp4, a Hugging Face safetensors model -> the
compressed-tensors checkpoint llm-compressor writes (pack-quantized, nvfp4-pack-quantized,
mxfp4-pack-quantized) (vLLM, SGLang and transformers load it). The
expected tensors and quantization_config come from llm-compressor's own oneshot + save_compressed
on the same tiny_hf.py models (tests/fixtures/make_ct_convert_fixtures.py): every tensor must have
the same name, dtype, shape and bytes, and the config the same quantization_config."""
import hashlib
import json
import os

import numpy as np
import pytest
from safetensors import safe_open

from conftest import FIXTURES, convert_as_recorded, load_safetensors_dir, run_quantd, tiny_hf

FIX = json.load(open(os.path.join(FIXTURES, "ct_convert.json")))["cases"]
FMT = {"W4A16": "w4a16", "W4A16_ASYM": "w4a16", "W8A16": "w8a16", "NVFP4A16": "nvfp4", "MXFP4A16": "mxfp4"}


@pytest.mark.parametrize("case", sorted(FIX))
def test_equals_llm_compressor(tmp_path, case):
    fx = FIX[case]
    asym = ["--param", "symmetric=false"] if fx["scheme"].endswith("_ASYM") else []
    src, dst = convert_as_recorded(tmp_path, fx, "--fmt", FMT[fx["scheme"]], *asym)
    cfg = json.load(open(dst / "config.json"))
    assert cfg.pop("quantization_config") == fx["quantization_config"]
    assert cfg == json.load(open(src / "config.json"))
    for fn in ("generation_config.json", "tokenizer_config.json"):
        assert (dst / fn).read_text() == (src / fn).read_text()


def test_a_changed_weight_changes_the_bytes(tmp_path):
    """The fixture check can fail: the largest weight of one group doubled moves its scale."""
    from safetensors.numpy import save_file
    fx = FIX["w4a16_bf16"]
    src = tiny_hf(tmp_path / "hf", *fx["tiny_hf"])
    st = os.path.join(src, "model.safetensors")
    with safe_open(st, "numpy") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    w = t["model.layers.0.self_attn.q_proj.weight"]
    i = int(np.argmax(np.abs(w.astype(np.float32))))
    w = w.copy()
    w.flat[i] *= 2
    t["model.layers.0.self_attn.q_proj.weight"] = w
    save_file(t, st, metadata={"format": "pt"})
    run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "w4a16")
    ours = load_safetensors_dir(tmp_path / "q")
    scale = "model.layers.0.self_attn.q_proj.weight_scale"
    assert hashlib.sha256(ours[scale].tobytes()).hexdigest() != fx["tensors"][scale]["sha256"]


def test_int8_names_the_w8a16_layout(tmp_path):
    """--fmt int8, as a checkpoint layout, is llm-compressor's W8A16 (what its preset writes)."""
    fx = FIX["w8a16_f16"]
    _, dst = convert_as_recorded(tmp_path, fx, "--fmt", "int8")
    assert json.load(open(dst / "config.json"))["quantization_config"] == fx["quantization_config"]


@pytest.mark.parametrize("case", ["nvfp4_f32", "mxfp4_bf16"])
def test_single_file_fp4_as_llm_compressor(tmp_path, case):
    """One .safetensors in, one out: the same tensors, the config in its __metadata__."""
    fx = FIX[case]
    _, dst = convert_as_recorded(tmp_path, fx, "--fmt", FMT[fx["scheme"]], src_file="model.safetensors")
    with safe_open(str(dst / "model.safetensors"), "numpy") as f:
        assert json.loads(f.metadata()["quantization_config"]) == fx["quantization_config"]
