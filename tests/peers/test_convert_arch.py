"""quantd convert on every architecture of the table against what the tools themselves wrote for the
same tiny models (tests/fixtures/arch/*.json, made by tests/fixtures/make_arch_table.py; the source
is rebuilt without torch by tests/checkpoint/tiny_hf.py --arch):

- config.json, whole, against the one the tool wrote (test_config_equals_the_tool): every key,
  value and JSON type (0.0 stays a float), and the text: llm-compressor's bytes (json.dump, no
  final newline), transformers' to_json_string for bitsandbytes (indent 2, sorted keys, a final
  newline). AutoAWQ's config is not in the observations (it saves under transformers 4.57, which
  re-serializes a transformers 5 config: docs/convert.md): there the source's with the keys
  AutoAWQ itself sets, float16 and use_cache false.
- compressed-tensors (W4A16, W4A16_ASYM, W8A16, NVFP4A16, MXFP4A16) and AutoAWQ: every tensor's
  name, dtype, shape and bytes, and the quantization_config, equal the tool's. Where quantd writes
  other names than the tool by decision (tests/fixtures/arch/decisions.json: Mixtral's experts under
  llm-compressor), the expected names are the tool's mapped back to the source's.
- transformers + bitsandbytes: names, dtypes and shapes of every tensor (the quant_state JSON is
  padded by quantd: its length is not compared, its content is), and the bytes of every tensor the
  tool did not quantize. The observations' "device" says where bitsandbytes ran: bitsandbytes 0.50's
  CPU code does not write the bytes of its CUDA kernels (which quantd's nf4/fp4 match), so the
  quantized weights' bytes are compared only against a CUDA recording (make_arch_table.py --tools
  bnb on a GPU); the absmax codes also depend on the double-quant offset, torch's CUDA mean
  (docs/convert.md), and are left to tests/consumers/test_transformers_bnb.py."""
import hashlib
import json
import os

import numpy as np
import pytest

from conftest import FIXTURES, load_safetensors_dir, run_quantd

import sys
sys.path.insert(0, FIXTURES)
sys.path.insert(0, os.path.join(os.path.dirname(FIXTURES), "checkpoint"))
import derive_arch_table as derive  # noqa: E402
import tiny_hf  # noqa: E402

OBSERVATIONS = {o["name"]: o for o in derive.load_observations()[0]}
TABLE = json.load(open(derive.TABLE_JSON))
CT = {"W4A16": ["--fmt", "w4a16"], "W4A16_ASYM": ["--fmt", "w4a16", "--param", "symmetric=false"],
      "W8A16": ["--fmt", "w8a16"], "NVFP4A16": ["--fmt", "nvfp4"], "MXFP4A16": ["--fmt", "mxfp4"]}
CTINT = ("W4A16", "W4A16_ASYM", "W8A16")
CASES = [(n, "ct", s) for n in OBSERVATIONS for s in CT]
CASES += [(n, "awq", "awq") for n, o in OBSERVATIONS.items() if o["autoawq"]["supported"]]
CASES += [(n, "bnb", qt) for n in OBSERVATIONS for qt in ("nf4", "fp4")]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name.replace(".", "_"))
            tiny_hf.write_arch(OBSERVATIONS[name]["source"], made[name])
        return made[name]
    return get


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def expected_ct_names(obs, tensors):
    """The tool's tensors under the names quantd writes: where the table keeps the source's names
    against the tool's renames (decisions.json), each renamed module mapped back."""
    rules = TABLE[obs["model_type"]]["layouts"]["ct"]
    if "peer_renames" not in rules or rules["renames"]:
        return tensors
    back = {saved[:-len(".weight")]: src[:-len(".weight")] for saved, src in obs.get("llm_compressor_names", {}).items()}
    out = {}
    for k, v in tensors.items():
        module, _, suffix = k.rpartition(".")
        out[back.get(module, module) + "." + suffix] = v
    return out


def convert(src, dst, args):
    p = run_quantd("convert", "--in", src, "--out", dst, *args)
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    return load_safetensors_dir(dst), lines, json.load(open(os.path.join(dst, "config.json")))


def args_of(layout, run):
    return CT[run] if layout == "ct" else ["--fmt", "awq"] if layout == "awq" else ["--fmt", run]


def tool_config(obs, layout, run):
    """The config.json the tool wrote: (parsed, SHA-256 of its bytes or None). AutoAWQ's is not
    observed: the source's, with AwqConfig's quantization_config and what BaseAWQForCausalLM's
    from_pretrained(torch_dtype=float16, use_cache=False) leaves in the config it saves."""
    if layout == "ct":
        rec = obs["llm_compressor"][run]
        return rec["config"], rec["config_sha256"]
    if layout == "bnb":  # recorded before make_arch_table.py kept the bytes' SHA-256
        rec = obs["bnb"][run]
        return rec["config"], rec.get("config_sha256")
    cfg = json.loads(obs["source"]["files"]["config.json"])
    cfg["quantization_config"] = obs["autoawq"]["quantization_config"]
    for key in ("torch_dtype", "dtype"):
        if key in cfg:
            cfg[key] = "float16"
    cfg["use_cache"] = False
    return cfg, None


def typed(v):
    """A JSON value's text with its types (1, 1.0 and true differ), keys sorted."""
    return json.dumps(v, sort_keys=True)


@pytest.mark.parametrize("name,layout,run", CASES, ids=[f"{n}-{r}" for n, _, r in CASES])
def test_config_equals_the_tool(tmp_path, sources, name, layout, run):
    obs = OBSERVATIONS[name]
    want, want_sha = tool_config(obs, layout, run)
    run_quantd("convert", "--in", sources(name), "--out", tmp_path / "q", *args_of(layout, run))
    raw = (tmp_path / "q" / "config.json").read_bytes()
    ours = json.loads(raw)
    differ = {k: (ours.get(k, "<absent>"), want.get(k, "<absent>")) for k in sorted(set(ours) | set(want))
              if typed(ours.get(k, "<absent>")) != typed(want.get(k, "<absent>"))}
    assert not differ, f"config.json keys where quantd (first) and the tool (second) differ: {differ}"
    if want_sha:  # the tool's own bytes
        assert hashlib.sha256(raw).hexdigest() == want_sha, f"config.json's bytes are not the tool's: ...{raw[-40:]!r}"
    else:  # transformers' to_json_string
        assert raw.decode() == json.dumps(want, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("name,layout,run", CASES, ids=[f"{n}-{r}" for n, _, r in CASES])
def test_equals_the_tool(tmp_path, sources, name, layout, run):
    obs = OBSERVATIONS[name]
    if layout == "ct":
        rec = obs["llm_compressor"][run]
        want, want_qc, args = expected_ct_names(obs, rec["tensors"]), rec["config"]["quantization_config"], CT[run]
    elif layout == "awq":
        rec = obs["autoawq"]
        want, want_qc, args = rec["tensors"], rec["quantization_config"], ["--fmt", "awq"]
    else:
        rec = obs["bnb"][run]
        want, want_qc, args = rec["tensors"], rec["config"]["quantization_config"], ["--fmt", run]
    ours, lines, config = convert(sources(name), tmp_path / "q", args)
    summary = lines[-1]["summary"]
    assert (summary["arch"], summary["rule"]) == (obs["model_type"], "table")
    assert "rule_why" not in summary
    assert all(line["rule"] == "table" for line in lines[:-1])
    assert config["quantization_config"] == want_qc
    assert sorted(ours) == sorted(want)
    quantized = {k[:-len(".weight.quant_state.bitsandbytes__" + run)] for k in want if ".quant_state." in k}
    for k, w in sorted(want.items()):
        t = ours[k]
        assert str(t.dtype) == w["dtype"], k
        if ".quant_state.bitsandbytes__" in k:  # quantd pads the JSON with spaces (docs/convert.md)
            js = json.loads(bytes(t).decode())
            assert (js["quant_type"], js["blocksize"], js["dtype"]) == (run, 64, "bfloat16"), k
            assert js["shape"] == obs["source"]["tensors"][k.split(".quant_state.")[0]]["shape"], k
            continue
        assert list(t.shape) == w["shape"], k
        module = k.split(".weight")[0] if ".weight" in k else None
        if layout == "bnb" and module in quantized:
            device_independent = k.endswith((".quant_map", ".nested_quant_map")) or rec["device"] == "cuda" and \
                k.endswith(".weight")
            if not device_independent:
                continue  # see the docstring: bitsandbytes' CPU bytes are not its CUDA bytes
        if layout == "ct" and run in CTINT and k.endswith((".weight_packed", ".weight_zero_point")):
            assert "Triton _quantize_kernel" in rec.get("integer_codes", ""), (
                f"{name}/{run}: recorded with compressed-tensors' eager torch fallback (the quotient rounded to "
                "the weight's dtype), not the Triton kernel llm-compressor runs on a CUDA GPU and quantd follows: "
                "re-record with make_arch_table.py --tools llm_compressor (it runs that kernel, in Triton's "
                "interpreter without CUDA)")
            assert sha(t) == w["sha256"], f"{k}: the codes differ from llm-compressor's ({rec['integer_codes']})"
            continue
        assert sha(t) == w["sha256"], k


def arch_source(sources, tmp_path, name, model_type=None, extra=None):
    """A copy of an observation's source with another model_type and/or an extra 2-D weight."""
    src = tmp_path / "src"
    spec = json.loads(json.dumps(OBSERVATIONS[name]["source"]))
    if model_type:
        cfg = json.loads(spec["files"]["config.json"])
        cfg["model_type"] = model_type
        spec["files"]["config.json"] = json.dumps(cfg, indent=2)
    if extra:
        spec["tensors"][extra] = {"dtype": "BF16", "shape": [128, 256]}
    tiny_hf.write_arch(spec, src)
    return src


def test_unknown_model_type_goes_by_the_generic_rule_and_says_so(tmp_path, sources):
    """A model type the table lacks: every 2-D float weight but embeddings and the head, as before
    the table; the summary names the model type and why, every progress line says "generic". On a
    Llama that rule is the table's, so the tensors equal llm-compressor's."""
    src = arch_source(sources, tmp_path, "llama", model_type="my_llama")
    ours, lines, _ = convert(src, tmp_path / "q", CT["NVFP4A16"])
    summary = lines[-1]["summary"]
    assert (summary["arch"], summary["rule"]) == ("my_llama", "generic")
    assert "my_llama" in summary["rule_why"] and "not in quantd's architecture table" in summary["rule_why"]
    assert {line["rule"] for line in lines[:-1]} == {"generic"}
    want = OBSERVATIONS["llama"]["llm_compressor"]["NVFP4A16"]["tensors"]
    assert {k: sha(v) for k, v in ours.items()} == {k: w["sha256"] for k, w in want.items()}


def test_generic_rule_on_a_moe_quantizes_what_the_table_keeps(tmp_path, sources):
    """The table matters: Mixtral under another name gets its router and (bitsandbytes) its experts
    quantized, which transformers does not load (issue 26)."""
    src = arch_source(sources, tmp_path, "mixtral", model_type="my_moe")
    ours, lines, _ = convert(src, tmp_path / "q", ["--fmt", "nf4"])
    assert "model.layers.0.block_sparse_moe.gate.weight.absmax" in ours
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight.absmax" in ours
    assert lines[-1]["summary"]["rule"] == "generic"


def test_a_weight_the_entry_does_not_list_goes_by_the_generic_rule(tmp_path, sources):
    extra = "model.layers.1.block_sparse_moe.new_proj.weight"
    src = arch_source(sources, tmp_path, "mixtral", extra=extra)
    ours, lines, _ = convert(src, tmp_path / "q", CT["NVFP4A16"])
    summary = lines[-1]["summary"]
    assert (summary["arch"], summary["rule"]) == ("mixtral", "table")
    assert summary["rule_why"].startswith("1 weight that the mixtral entry")
    assert [line["name"] for line in lines[:-1] if line["rule"] == "generic"] == [extra]
    assert "model.layers.1.block_sparse_moe.new_proj.weight_packed" in ours


def test_mixtral_experts_keep_the_names_vllm_loads(tmp_path, sources):
    """decisions.json: not llm-compressor's experts.N.gate_proj, the source's experts.N.w1 (vLLM's
    Mixtral loader maps w1/w2/w3 only)."""
    ours, _, _ = convert(sources("mixtral"), tmp_path / "q", CT["W4A16"])
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight_packed" in ours
    assert not [k for k in ours if ".experts." in k and "_proj" in k]
    peer = OBSERVATIONS["mixtral"]["llm_compressor"]["W4A16"]["tensors"]
    assert "model.layers.0.block_sparse_moe.experts.3.gate_proj.weight_packed" in peer


def test_single_file_goes_by_the_generic_rule_and_says_so(tmp_path, sources):
    src = sources("qwen3_moe") / "model.safetensors"
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "q.safetensors", "--fmt", "mxfp4")
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    assert (summary["arch"], summary["rule"]) == ("", "generic")
    assert "config.json" in summary["rule_why"]
