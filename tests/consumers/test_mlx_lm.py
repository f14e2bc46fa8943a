"""mlx-lm itself loads quantd's MLX directories: `mlx_lm.load` (strict: every parameter of the model
class present, with the quantized modules' shapes) opens the directory `quantd convert --fmt mlx_*`
wrote, and the model gives the same logits and greedily generates the same tokens as the model
mlx_lm.convert -q made from the same source (mlx 0.32.4 CPU, mlx-lm 0.32.2; tiny models of the
architecture table with a tiny tokenizer: tests/checkpoint/tiny_hf.py --arch ... --tokenizer)."""
import json
import os
import subprocess
import sys

import pytest

try:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.convert import convert as mlx_convert
    from mlx_lm.generate import generate_step
except ImportError as e:  # a missing runtime is a failure, never a skip
    raise ImportError("tests/consumers/test_mlx_lm.py needs mlx-lm==0.32.2 and mlx[cpu]==0.32.4 in the test venv "
                      "(tests/requirements.txt lists them: run 'make venv')") from e

from conftest import run_quantd

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TINY_HF = os.path.join(ROOT, "tests", "checkpoint", "tiny_hf.py")
ARCH = os.path.join(ROOT, "tests", "fixtures", "arch")
MODES = {"mlx_affine": "affine", "mlx_mxfp4": "mxfp4", "mlx_nvfp4": "nvfp4", "mlx_mxfp8": "mxfp8"}
PROMPT = "<s> w5 w17 w42 w9 w100"
TOKENS = 8


def generated(path):
    model, tokenizer = load(str(path))
    ids = mx.array(tokenizer.encode(PROMPT))
    logits = model(ids[None])
    out = []
    for (token, _), _ in zip(generate_step(ids, model, max_tokens=TOKENS), range(TOKENS)):
        out.append(int(token))
    return logits.astype(mx.float32), out


@pytest.mark.parametrize("name,fmt", [("llama", "mlx_affine"), ("llama", "mlx_mxfp4"), ("llama", "mlx_nvfp4"),
                                      ("llama", "mlx_mxfp8"), ("qwen2", "mlx_affine"), ("gemma2", "mlx_affine"),
                                      pytest.param("gemma3_text", "mlx_affine", marks=pytest.mark.xfail(
                                          raises=IndexError, strict=True,
                                          reason="mlx-lm 0.32.2's gemma3_text runs no model with fewer layers than "
                                                 "its sliding_window_pattern (6): its own converted 2-layer model "
                                                 "fails first (create_attention_mask(h, cache[5]))")),
                                      ("phi3", "mlx_affine"),
                                      ("mixtral", "mlx_affine"), ("qwen2_moe", "mlx_mxfp4"), ("qwen3_moe", "mlx_nvfp4"),
                                      ("deepseek_v3", "mlx_mxfp4"), ("deepseek_v3.no_q_lora", "mlx_affine")])
def test_mlx_lm_loads_and_generates_as_its_own(tmp_path, name, fmt):
    src = tmp_path / "hf"
    subprocess.run([sys.executable, TINY_HF, str(src), "--arch", os.path.join(ARCH, name + ".json"), "--tokenizer"],
                   check=True)
    if name == "qwen3_moe":  # the keys mlx-lm 0.32.2 needs, as a transformers 4 config has them
        cfg = json.load(open(src / "config.json"))
        cfg["num_experts"], cfg["rope_theta"] = cfg["num_local_experts"], cfg["rope_parameters"]["rope_theta"]
        json.dump(cfg, open(src / "config.json", "w"), indent=2)
    run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", fmt)
    mlx_convert(hf_path=str(src), mlx_path=str(tmp_path / "mlx"), quantize=True, q_mode=MODES[fmt])
    theirs_logits, theirs = generated(tmp_path / "mlx")  # first: where mlx-lm's own fails, the case is its
    ours_logits, ours = generated(tmp_path / "q")
    assert len(ours) == TOKENS
    assert ours == theirs
    assert mx.array_equal(ours_logits, theirs_logits).item()
    assert mx.isfinite(ours_logits).all().item()
