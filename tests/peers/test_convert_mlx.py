"""quantd convert --fmt mlx_affine / mlx_mxfp4 / mlx_nvfp4 / mlx_mxfp8, a Hugging Face model directory
-> what `mlx_lm.convert -q` writes (mlx-lm 0.32.2 on mlx 0.32.4, run here on the same source at test
time): the same tensor names, dtypes, shapes and bytes (tensor by tensor: mlx's file order is its
hash map's), the same safetensors metadata, file names, model.safetensors.index.json, config.json
and model card byte for byte, for the architecture table's models (tests/fixtures/arch, with a tiny
tokenizer) and for plain tiny Llamas (f32/f16/bf16, sharded, tied, a torch_dtype that casts)."""
import json
import os
import struct

import pytest

try:
    from mlx_lm.convert import convert as mlx_convert
except ImportError as e:  # a missing peer is a failure, never a skip
    raise ImportError("tests/peers/test_convert_mlx.py needs mlx-lm==0.32.2 and mlx[cpu]==0.32.4 in the test "
                      "venv (tests/requirements.txt lists them: run 'make venv')") from e

from conftest import FIXTURES, run_quantd, tiny_hf

ARCH = os.path.join(FIXTURES, "arch")
WRITTEN = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen2_moe", "qwen3_moe",
           "deepseek_v3", "deepseek_v3.no_q_lora"]
MODES = {"mlx_affine": "affine", "mlx_mxfp4": "mxfp4", "mlx_nvfp4": "nvfp4", "mlx_mxfp8": "mxfp8"}
SAME_BYTES = ["config.json", "model.safetensors.index.json", "README.md", "generation_config.json"]


def st_tensors(d):
    """{name: (dtype, shape, bytes)} of a directory's model*.safetensors, and {file: __metadata__}."""
    out, meta = {}, {}
    for fn in sorted(os.listdir(d)):
        if not (fn.startswith("model") and fn.endswith(".safetensors")):
            continue
        with open(os.path.join(d, fn), "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        meta[fn] = h.pop("__metadata__", None)
        for k, v in h.items():
            s, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], b[8 + n + s:8 + n + e])
    return out, meta


def arch_source(tmp_path, name, mlx_config=True):
    """An architecture's source with a tokenizer; mlx_config: qwen3_moe's config.json with the keys
    mlx-lm 0.32.2 needs and a transformers 5 config lacks (as a transformers 4 config has them)."""
    src = tiny_hf(tmp_path / "hf", "--arch", os.path.join(ARCH, name + ".json"), "--tokenizer")
    if name == "qwen3_moe" and mlx_config:
        cfg = json.load(open(src / "config.json"))
        cfg["num_experts"], cfg["rope_theta"] = cfg["num_local_experts"], cfg["rope_parameters"]["rope_theta"]
        json.dump(cfg, open(src / "config.json", "w"), indent=2)
    return src


def peer(src, dst, fmt, bits=None, group=None):
    mlx_convert(hf_path=str(src), mlx_path=str(dst), quantize=True, q_bits=bits, q_group_size=group,
                q_mode=MODES[fmt])
    return dst


def ours(src, dst, fmt, bits=None, group=None):
    args = ["convert", "--in", src, "--out", dst, "--fmt", fmt]
    if bits:
        args += ["--param", f"bits={bits}"]
    if group:
        args += ["--param", f"group_size={group}"]
    run_quantd(*args)
    return dst


def assert_same_directory(theirs, mine):
    t, tm = st_tensors(theirs)
    m, mm = st_tensors(mine)
    assert mm == tm and all(v == {"format": "mlx"} for v in mm.values()), f"files/metadata {mm} != mlx-lm's {tm}"
    assert sorted(m) == sorted(t), f"names: only mlx-lm's {sorted(set(t) - set(m))}, only quantd's {sorted(set(m) - set(t))}"
    for k in t:
        assert m[k][:2] == t[k][:2], f"{k}: dtype/shape {m[k][:2]} != mlx-lm's {t[k][:2]}"
        assert m[k][2] == t[k][2], f"{k}: bytes differ"
    for fn in SAME_BYTES:
        with open(os.path.join(theirs, fn), "rb") as a, open(os.path.join(mine, fn), "rb") as b:
            assert b.read() == a.read(), f"{fn} differs from mlx-lm's"
    # the tokenizer: mlx-lm writes it back through transformers; quantd copies the source's
    assert sorted(os.listdir(mine)) == sorted(os.listdir(theirs))
    return t


@pytest.mark.parametrize("name", WRITTEN)
def test_architecture_equals_mlx_lm(tmp_path, name):
    src = arch_source(tmp_path, name)
    t = assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine"), ours(src, tmp_path / "q", "mlx_affine"))
    assert any(k.endswith(".scales") for k in t)


@pytest.mark.parametrize("name", ["llama", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
@pytest.mark.parametrize("fmt", ["mlx_mxfp4", "mlx_nvfp4", "mlx_mxfp8"])
def test_float_modes_equal_mlx_lm(tmp_path, name, fmt):
    """(qwen3_moe's router mlp.gate stays affine 8-bit, group 64, recorded per module in config.json)"""
    src = arch_source(tmp_path, name)
    t = assert_same_directory(peer(src, tmp_path / "mlx", fmt), ours(src, tmp_path / "q", fmt))
    if name == "qwen3_moe":
        assert t["model.layers.1.mlp.gate.biases"][0] == "BF16"
    if name == "deepseek_v3":  # MLA's per-head embed_q [heads, rank, nope]: quantized where 16 or 32 divides nope
        assert t["model.layers.0.self_attn.embed_q.weight"][1][:2] == [4, 128]
        assert "model.layers.0.self_attn.embed_q.scales" in t and "model.layers.1.mlp.gate.weight" in t


@pytest.mark.parametrize("bits,group", [(1, 64), (2, 32), (3, 32), (3, 128), (5, 64), (6, 64), (8, 128), (4, 32),
                                        (4, 128)])
def test_affine_bits_and_groups_equal_mlx_lm(tmp_path, bits, group):
    src = arch_source(tmp_path, "qwen2")
    assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine", bits, group),
                          ours(src, tmp_path / "q", "mlx_affine", bits, group))


@pytest.mark.parametrize("args", [("f32",), ("f16",), ("bf16", "--tied"), ("f16", "--shards", "3"),
                                  ("bf16", "--ffn", "200")],
                         ids=["f32", "f16", "bf16_tied", "f16_sharded", "bf16_ffn200"])
def test_tiny_llama_equals_mlx_lm(tmp_path, args):
    """f32/f16 sources, a tied head (dropped), shards in, and an FFN width (200) no group divides:
    down_proj stays unquantized."""
    src = tiny_hf(tmp_path / "hf", *args, "--tokenizer")
    t = assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine"), ours(src, tmp_path / "q", "mlx_affine"))
    assert ("lm_head.weight" in t) != ("--tied" in args)


@pytest.mark.parametrize("torch_dtype", ["bfloat16", "float16"])
def test_torch_dtype_casts_before_quantizing(tmp_path, torch_dtype):
    """An f32 model whose config says torch_dtype bfloat16/float16: mlx_lm.convert casts every tensor
    to it first, so the scales and copied tensors come out in that dtype."""
    src = tiny_hf(tmp_path / "hf", "f32", "--tokenizer")
    cfg = json.load(open(src / "config.json"))
    cfg["torch_dtype"] = torch_dtype
    json.dump(cfg, open(src / "config.json", "w"), indent=2)
    t = assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine"), ours(src, tmp_path / "q", "mlx_affine"))
    assert t["model.norm.weight"][0] == {"bfloat16": "BF16", "float16": "F16"}[torch_dtype]


def test_a_changed_weight_changes_the_bytes(tmp_path):
    """The comparison can fail: quantd's output of a model with one weight doubled differs from mlx-lm's
    output of the original."""
    src = arch_source(tmp_path, "llama")
    theirs = peer(src, tmp_path / "mlx", "mlx_affine")
    import ml_dtypes  # noqa: F401 (registers bfloat16 with numpy for safetensors)
    from safetensors.numpy import load_file, save_file
    st = os.path.join(src, "model.safetensors")
    w = load_file(st)
    w["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"] * 2
    save_file(w, st, metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="up_proj"):
        assert_same_directory(theirs, ours(src, tmp_path / "q", "mlx_affine"))


def test_no_tokenizer_is_refused(tmp_path):
    src = arch_source(tmp_path, "llama")
    os.remove(src / "tokenizer.json")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "mlx_affine", check=False)
    assert p.returncode != 0 and "no tokenizer" in p.stderr and "mlx-lm" in p.stderr
    assert not os.path.exists(tmp_path / "q")


@pytest.mark.parametrize("group", [32, 64])
def test_deepseek_v3_cast_keeps_e_score_correction_bias(tmp_path, group):
    """torch_dtype float16 on a bf16 DeepSeek-V3: every tensor cast but e_score_correction_bias (the
    class's cast_predicate); group 32 quantizes MLA's embed_q too (nope 32), group 64 leaves it."""
    src = arch_source(tmp_path, "deepseek_v3")
    cfg = json.load(open(src / "config.json"))
    cfg["torch_dtype"] = "float16"
    json.dump(cfg, open(src / "config.json", "w"), indent=2)
    t = assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine", 4, group),
                              ours(src, tmp_path / "q", "mlx_affine", 4, group))
    assert t["model.layers.1.mlp.gate.e_score_correction_bias"][0] == "BF16"
    assert t["model.norm.weight"][0] == "F16"
    assert ("model.layers.0.self_attn.embed_q.scales" in t) == (group == 32)


def test_unknown_model_type_and_single_file_are_refused(tmp_path):
    src = arch_source(tmp_path, "llama")
    cfg = json.load(open(src / "config.json"))
    cfg["model_type"] = "llama_next"
    json.dump(cfg, open(src / "config.json", "w"))
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "mlx_mxfp4", check=False)
    assert p.returncode != 0 and "llama_next" in p.stderr and "not in quantd's MLX table" in p.stderr
    p = run_quantd("convert", "--in", src / "model.safetensors", "--out", tmp_path / "q.safetensors", "--fmt",
                   "mlx_affine", check=False)
    assert p.returncode != 0 and "not a directory" in p.stderr


def test_global_scale_and_scale_dtype_are_refused(tmp_path):
    src = arch_source(tmp_path, "llama")
    for fmt, param in [("mlx_nvfp4", "global_scale=100"), ("mlx_affine", "scale_dtype=f32")]:
        p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", fmt, "--param", param, check=False)
        assert p.returncode != 0 and "mlx_lm.convert" in p.stderr, p.stderr


def test_tied_head_in_the_file_is_dropped(tmp_path):
    """tie_word_embeddings true with an lm_head.weight in the file (as some checkpoints ship it): the
    model class's sanitize drops it (llama, qwen2, qwen3, mixtral)."""
    src = tiny_hf(tmp_path / "hf", "bf16", "--tokenizer")
    cfg = json.load(open(src / "config.json"))
    cfg["tie_word_embeddings"] = True
    json.dump(cfg, open(src / "config.json", "w"), indent=2)
    t = assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine"), ours(src, tmp_path / "q", "mlx_affine"))
    assert "lm_head.weight" not in t and "model.embed_tokens.scales" in t


def test_qwen3_moe_config_mlx_lm_cannot_build_is_refused(tmp_path):
    """A transformers 5 qwen3_moe config (num_local_experts, rope_parameters): mlx-lm 0.32.2 builds no
    model from it (its own convert fails), so quantd says which key to add instead of writing one."""
    src = arch_source(tmp_path, "qwen3_moe", mlx_config=False)
    with pytest.raises(TypeError, match="num_experts"):
        peer(src, tmp_path / "mlx", "mlx_affine")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "mlx_affine", check=False)
    assert p.returncode != 0 and "'num_experts'" in p.stderr and "add it" in p.stderr
    assert not os.path.exists(tmp_path / "q")


def test_config_keys_load_config_and_save_config_change(tmp_path):
    """generation_config.json's eos_token_id (a list here) replaces config.json's (load_config);
    _name_or_path and vision_config are dropped, floats keep their spelling (save_config)."""
    src = tiny_hf(tmp_path / "hf", "bf16", "--tokenizer")
    cfg = json.load(open(src / "config.json"))
    cfg.update({"_name_or_path": "/somewhere/else", "vision_config": {"hidden_size": 8}, "rope_theta": 500000.0,
                "initializer_range": 2e-05, "rope_scaling": {"factor": 8.0, "rope_type": "llama3",
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                             "original_max_position_embeddings": 8192}})
    json.dump(cfg, open(src / "config.json", "w"), indent=2)
    json.dump({"bos_token_id": 1, "eos_token_id": [2, 7]}, open(src / "generation_config.json", "w"))
    assert_same_directory(peer(src, tmp_path / "mlx", "mlx_affine"), ours(src, tmp_path / "q", "mlx_affine"))
    out = json.load(open(tmp_path / "q" / "config.json"))
    assert out["eos_token_id"] == [2, 7] and "_name_or_path" not in out and "vision_config" not in out
