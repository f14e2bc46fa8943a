"""quantd convert --fmt w4a16 / w8a16 against llm-compressor and transformers themselves (any machine with
torch, transformers, llmcompressor and compressed-tensors; CPU is enough): a tiny random Llama
quantized by llm-compressor's own data-free oneshot (QuantizationModifier, targets Linear,
ignore lm_head, scheme W4A16, W4A16_ASYM, W8A16, NVFP4A16 or MXFP4A16) and saved with save_compressed, against quantd's
directory from the same weights. The integer codes are those llm-compressor writes on CUDA (on a
machine without, its Triton kernel runs in Triton's interpreter: tests/fixtures/ct_triton.py).
Every tensor must be identical and the quantization_config
equal; transformers loads both directories (compressed-tensors decompression) to identical
weights and identical logits on a fixed input."""
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
llmcompressor = pytest.importorskip("llmcompressor")


import ct_triton  # noqa: E402  (tests/fixtures, put on the path by conftest)
from conftest import QUANTD, torch_tensors  # noqa: E402

ct_triton.install()  # llm-compressor's integer codes as on CUDA, on any machine


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dtype != torch.int64
                                                                      else a, b.view(torch.uint8)
                                                                      if b.dtype != torch.int64 else b)


FMT = {"W4A16": "w4a16", "W4A16_ASYM": "w4a16", "W8A16": "w8a16", "NVFP4A16": "nvfp4", "MXFP4A16": "mxfp4"}


@pytest.mark.parametrize("scheme", sorted(FMT))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_transformers_loads_quantd_like_llm_compressor(tmp_path, scheme, dtype):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=640, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                                   tie_word_embeddings=False)
    src, ref, ours = tmp_path / "src", tmp_path / "ref", tmp_path / "ours"
    transformers.LlamaForCausalLM(cfg).to(dtype).save_pretrained(src)
    m = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    oneshot(model=m, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]))
    m.save_pretrained(ref, save_compressed=True)
    args = [QUANTD, "convert", "--in", src, "--out", ours, "--fmt", FMT[scheme]]
    if scheme.endswith("_ASYM"):
        args += ["--param", "symmetric=false"]
    subprocess.run(list(map(str, args)), check=True, capture_output=True)

    a, b = torch_tensors(ref), torch_tensors(ours)
    assert sorted(a) == sorted(b)
    assert [k for k in a if not same(a[k], b[k])] == []
    qa = json.load(open(ref / "config.json"))["quantization_config"]
    qb = json.load(open(ours / "config.json"))["quantization_config"]
    assert qa == qb

    dense = transformers.CompressedTensorsConfig(run_compressed=False)
    la = transformers.AutoModelForCausalLM.from_pretrained(ref, quantization_config=dense)
    lb = transformers.AutoModelForCausalLM.from_pretrained(ours, quantization_config=dense)
    sa, sb = la.state_dict(), lb.state_dict()
    assert sorted(sa) == sorted(sb)
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []
    w = sb["model.layers.0.self_attn.q_proj.weight"]
    orig = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=dtype).state_dict()
    assert not torch.equal(w, orig["model.layers.0.self_attn.q_proj.weight"])  # really decompressed int4
    if scheme.endswith("FP4A16") and dtype != torch.bfloat16:
        # compressed-tensors decompresses FP4 weights to bf16 whatever the model's dtype, which
        # leaves an f16/f32 model unrunnable as loaded: both get the same cast to run it
        la, lb = la.to(dtype), lb.to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ya, yb = la(ids).logits, lb(ids).logits
    assert torch.isfinite(yb).all() and torch.equal(ya, yb)
    print(f"{scheme} {dtype}: {len(a)} tensors identical, logits identical (max |logit| "
          f"{yb.abs().max().item():.3f})")
