"""quantd convert --fmt awq, a Hugging Face safetensors model -> the AutoAWQ GEMM checkpoint
(qweight, qzeros, scales per decoder Linear; every other float tensor in float16, as AutoAWQ's
half model saves it). The expected tensors come from AutoAWQ 0.2.9's own _apply_quant on every
decoder Linear of the same tiny_hf.py models (tests/fixtures/make_awq_convert_fixtures.py): the
same names, dtypes, shapes and bytes, and the quantization_config AwqConfig writes."""
import json
import os

import ml_dtypes  # noqa: F401 (numpy learns bfloat16)
import numpy as np
import pytest
from safetensors import safe_open

from conftest import FIXTURES, convert_as_recorded, load_safetensors_dir, run_quantd, tiny_hf

FIX = json.load(open(os.path.join(FIXTURES, "awq_convert.json")))["cases"]



@pytest.mark.parametrize("case", sorted(FIX))
def test_equals_autoawq(tmp_path, case):
    fx = FIX[case]
    src, dst = convert_as_recorded(tmp_path, fx, "--fmt", "awq")
    cfg = json.load(open(dst / "config.json"))
    assert cfg.pop("quantization_config") == fx["quantization_config"]
    assert cfg.pop("torch_dtype") == "float16"
    assert cfg.pop("use_cache") is False  # AutoAWQ's from_pretrained(use_cache=False)
    src_cfg = json.load(open(src / "config.json"))
    src_cfg.pop("torch_dtype")
    src_cfg.pop("use_cache", None)
    assert cfg == src_cfg


def test_large_cast_tensor_in_pieces(tmp_path):
    """A tensor cast to f16 larger than a pipeline piece (64 MiB: a 140000 x 256 bf16 embedding)
    is cast whole and right: equal to numpy's round-to-nearest-even cast of the source."""
    src = tiny_hf(tmp_path / "hf", "bf16", "--vocab", "140000", "--layers", "1")
    run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "awq")
    with safe_open(os.path.join(src, "model.safetensors"), "numpy") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert emb.nbytes > 64 << 20
    ours = load_safetensors_dir(tmp_path / "q")["model.embed_tokens.weight"]
    assert ours.dtype == np.float16 and ours.shape == emb.shape
    assert np.array_equal(ours.view(np.uint16), emb.astype(np.float32).astype(np.float16).view(np.uint16))
