"""quantd convert's 8-bit layouts on every architecture of the table against what the tools wrote
for the same tiny models (tests/fixtures/arch_fp8/*.json, made by
tests/fixtures/make_fp8_convert_fixtures.py; each source is tests/fixtures/arch/<name>.json's,
rebuilt without torch by tests/checkpoint/tiny_hf.py):

- llm-compressor 0.14.0.1's FP8_DYNAMIC, FP8_BLOCK and W8A8 (data-free oneshot, targets Linear,
  ignore lm_head, save_compressed) and transformers 5.17's FineGrainedFP8Config (from_pretrained +
  save_pretrained): every tensor's name, dtype, shape and bytes, the quantization_config, the
  whole config.json (keys, values, JSON types and its bytes) and the safetensors __metadata__.
- FineGrainedFP8's quantized weights are compared with transformers' own Fp8Quantize (the op its
  loader runs per weight) on the source's weights, not with its save: transformers 5.17's loader
  first casts each weight to the FP8Linear parameter's dtype (e4m3, unscaled: 96 % of N(0, 0.02)
  bf16 values change) and quantizes that; the observation records that its save is exactly that
  (saved_is_fp8quantize_of_e4m3_cast), and quantd does not repeat the double rounding
  (docs/convert.md). Names, dtypes, shapes, the other tensors and config.json are its save's.
- Where quantd writes other names than the tool by decision (tests/fixtures/arch/decisions.json:
  Mixtral's experts under llm-compressor), the expected names are the tool's mapped back to the
  source's, as tests/peers/test_convert_arch.py does for the other compressed-tensors schemes.
- FP8 (static input scale) is refused with what it needs."""
import hashlib
import json
import os
import struct

import numpy as np
import pytest

from conftest import FIXTURES, load_safetensors_dir, run_quantd

import sys
sys.path.insert(0, FIXTURES)
sys.path.insert(0, os.path.join(os.path.dirname(FIXTURES), "checkpoint"))
import tiny_hf  # noqa: E402

OBS_DIR = os.path.join(FIXTURES, "arch_fp8")
SOURCES = os.path.join(FIXTURES, "arch")
OBSERVATIONS = {fn[:-len(".json")]: json.load(open(os.path.join(OBS_DIR, fn)))
                for fn in sorted(os.listdir(OBS_DIR)) if fn.endswith(".json")}
TABLE = json.load(open(os.path.join(os.path.dirname(FIXTURES), "..", "server", "checkpoint", "arch_table.json")))
ARGS = {"FP8_DYNAMIC": ["--fmt", "fp8_e4m3"],
        "FP8_BLOCK": ["--fmt", "fp8_e4m3", "--param", "granularity=block"],
        "W8A8": ["--fmt", "w8a8"],
        "FineGrainedFP8": ["--fmt", "fp8_e4m3", "--param", "flow=transformers"]}
# (qwen3_moe: transformers' FineGrainedFP8 alone; llm-compressor's run of its 107 modules in
# Triton's interpreter was not made: make_fp8_convert_fixtures.py qwen3_moe on a CUDA machine)
CASES = [(n, s) for n, o in OBSERVATIONS.items() for s in ARGS
         if s in o.get("llm_compressor", {}) or (s == "FineGrainedFP8" and "finegrained_fp8" in o)]
# FineGrainedFP8 weights whose shape 128 does not divide: transformers' Fp8Quantize passes them
# through (its save holds their e4m3 cast, unscaled, and the weight_scale_inv parameter as
# torch.empty left it); quantd writes partial blocks, as DeepSeek-V3's own checkpoints have them
# (kv_a_proj_with_mqa: 576 rows, a [5, 56] scale grid). Names, dtypes and shapes are the save's.
UNTILED = {n: {f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight_scale_inv" for i in (0, 1)}
           for n in ("deepseek_v3", "deepseek_v3.no_q_lora")}
UNTILED["qwen2_moe"] = {f"model.layers.{i}.mlp.shared_expert_gate.weight_scale_inv" for i in (0, 1)}  # [1, 256]


def source_of(name):
    with open(os.path.join(SOURCES, name + ".json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name.replace(".", "_"))
            tiny_hf.write_arch(source_of(name)["source"], made[name])
        return made[name]
    return get


def record(obs, scheme):
    return obs["finegrained_fp8"] if scheme == "FineGrainedFP8" else obs["llm_compressor"][scheme]


def expected_names(obs, scheme, tensors):
    """llm-compressor's tensors under the names quantd writes (decisions.json: Mixtral's experts
    keep the source's names)."""
    if scheme == "FineGrainedFP8":
        return tensors
    rules = TABLE[obs["model_type"]]["layouts"]["ct"]
    if "peer_renames" not in rules or rules["renames"]:
        return tensors
    names = source_of(obs["name"]).get("llm_compressor_names", {})
    back = {saved[:-len(".weight")]: src[:-len(".weight")] for saved, src in names.items()}
    out = {}
    for k, v in tensors.items():
        module, _, suffix = k.rpartition(".")
        out[back.get(module, module) + "." + suffix] = v
    return out


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def metadata(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with open(os.path.join(d, fn), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                out[fn] = json.loads(f.read(n)).get("__metadata__")
    return out


def typed(v):
    return json.dumps(v, sort_keys=True)


@pytest.mark.parametrize("name,scheme", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_equals_the_tool(tmp_path, sources, name, scheme):
    obs = OBSERVATIONS[name]
    rec = record(obs, scheme)
    if scheme != "FineGrainedFP8":
        assert "Triton _quantize_kernel" in rec["integer_codes"], (
            f"{name}/{scheme}: recorded with compressed-tensors' eager torch fallback, not the Triton kernel "
            "llm-compressor runs on a CUDA GPU and quantd follows: re-record (make_fp8_convert_fixtures.py)")
    dst = tmp_path / "q"
    p = run_quantd("convert", "--in", sources(name), "--out", dst, *ARGS[scheme])
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    assert (summary["arch"], summary["rule"]) == (obs["model_type"], "table"), summary
    raw = (dst / "config.json").read_bytes()
    ours_cfg, want_cfg = json.loads(raw), rec["config"]
    assert ours_cfg["quantization_config"] == want_cfg["quantization_config"]
    differ = {k: (ours_cfg.get(k, "<absent>"), want_cfg.get(k, "<absent>")) for k in sorted(set(ours_cfg) | set(want_cfg))
              if typed(ours_cfg.get(k, "<absent>")) != typed(want_cfg.get(k, "<absent>"))}
    assert not differ, f"config.json keys where quantd (first) and the tool (second) differ: {differ}"
    assert hashlib.sha256(raw).hexdigest() == rec["config_sha256"], f"config.json's bytes: ...{raw[-40:]!r}"
    assert metadata(dst) == rec["metadata"]
    ours = load_safetensors_dir(dst)
    want = expected_names(obs, scheme, rec["tensors"])
    assert sorted(ours) == sorted(want)
    if scheme == "FineGrainedFP8":  # the quantized weights: Fp8Quantize of the source's (docstring)
        assert rec["saved_is_fp8quantize_of_e4m3_cast"]
        untiled = {k for k in want if k.endswith(".weight_scale_inv") and k not in rec["fp8quantize_of_source"]}
        assert untiled == UNTILED.get(name, set()), untiled
        untiled |= {k[:-len("_scale_inv")] for k in untiled}
        assert set(rec["fp8quantize_of_source"]) == {k for k, w in want.items() if w["dtype"] == "float8_e4m3fn" or
                                                     k.endswith("_scale_inv")} - untiled
        want = {**want, **rec["fp8quantize_of_source"]}
        for k in untiled:  # quantd's partial blocks, the peer's e4m3 cast and uninitialized scales
            want[k] = {**want[k], "sha256": None}
    for k, w in sorted(want.items()):
        t = ours[k]
        assert (str(t.dtype), list(t.shape)) == (w["dtype"], w["shape"]), k
        if w["sha256"] is not None:
            assert sha(t) == w["sha256"], f"{k}: the bytes differ from the tool's"


def test_fp8_static_is_refused_with_what_it_needs(tmp_path, sources):
    p = run_quantd("convert", "--in", sources("llama"), "--out", tmp_path / "q", "--fmt", "fp8_e4m3",
                   "--param", "granularity=tensor", check=False)
    assert p.returncode == 1
    assert "static" in p.stderr and "granularity=channel" in p.stderr, p.stderr
    assert not (tmp_path / "q").exists()
