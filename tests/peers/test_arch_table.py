"""The architecture table (server/checkpoint/arch_table.json and the generated arch_table.c) is
what tests/fixtures/derive_arch_table.py derives from the committed observations of the tools
(tests/fixtures/arch/*.json, tests/fixtures/make_arch_table.py); the sources of those observations
rebuild without torch to the recorded bytes; and the derivation refuses observations it cannot
express instead of guessing."""
import copy
import hashlib
import json
import os
import sys

import numpy as np
import pytest
from safetensors import safe_open

from conftest import FIXTURES, ROOT

sys.path.insert(0, FIXTURES)
sys.path.insert(0, os.path.join(ROOT, "tests", "checkpoint"))
import derive_arch_table as derive  # noqa: E402
import tiny_hf  # noqa: E402

OBSERVATIONS, DECISIONS = derive.load_observations()


def test_committed_table_is_derived_from_the_observations():
    text, c = derive.outputs()
    assert open(derive.TABLE_JSON).read() == text, "arch_table.json is stale: run tests/fixtures/derive_arch_table.py"
    assert open(derive.TABLE_C).read() == c, "arch_table.c is stale: run tests/fixtures/derive_arch_table.py"


def test_every_issue_architecture_is_in_the_table():
    table = json.load(open(derive.TABLE_JSON))
    for mt in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen2_moe",
               "qwen3_moe", "deepseek_v3"):
        assert mt in table, mt
    assert sum(1 for o in OBSERVATIONS if o["transformers"]["parameters_not_2d"]) >= 4  # MoE
    for o in OBSERVATIONS:
        if o["transformers"]["parameters_not_2d"]:
            experts = {k.split(".experts.")[1].split(".")[0] for k in o["source"]["tensors"] if ".experts." in k}
            assert len(experts) >= 4, o["name"]


@pytest.mark.parametrize("obs", OBSERVATIONS, ids=[o["name"] for o in OBSERVATIONS])
def test_source_rebuilds_without_torch(tmp_path, obs):
    tiny_hf.write_arch(obs["source"], tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "numpy") as f:
        got = {k: hashlib.sha256(np.ascontiguousarray(f.get_tensor(k)).tobytes()).hexdigest() for k in f.keys()}
    assert got == {k: e["sha256"] for k, e in obs["source"]["tensors"].items()}
    for fn, text in obs["source"]["files"].items():
        assert (tmp_path / fn).read_text() == text


def by_name(name):
    return copy.deepcopy(next(o for o in OBSERVATIONS if o["name"] == name))


def test_a_weight_neither_quantized_nor_kept_is_refused():
    obs = by_name("mixtral")
    del obs["bnb"]["nf4"]["tensors"]["model.layers.0.block_sparse_moe.gate.weight"]
    with pytest.raises(derive.Inconsistent, match="neither quantized nor kept"):
        derive.derive([obs], DECISIONS)


def test_runs_of_one_layout_that_disagree_are_refused():
    obs = by_name("qwen3_moe")
    ct = obs["llm_compressor"]["W8A16"]["tensors"]
    router = "model.layers.1.mlp.gate"
    ct[router + ".weight_packed"] = ct.pop(router + ".weight")
    with pytest.raises(derive.Inconsistent, match="select or change different tensors"):
        derive.derive([obs], DECISIONS)


def test_a_rename_needs_a_decision():
    with pytest.raises(derive.Inconsistent, match="decisions.json"):
        derive.derive([by_name("mixtral")], {})


def test_a_rewritten_tensor_must_be_one_the_table_can_make():
    obs = by_name("gemma2")
    out = obs["llm_compressor"]["NVFP4A16"]["tensors"]["model.norm.weight"]
    out["sha256"] = "0" * 64
    with pytest.raises(derive.Inconsistent, match="no rule of the table makes"):
        derive.derive([obs], DECISIONS)


def test_an_ignore_list_the_c_rule_cannot_reproduce_is_refused():
    obs = by_name("qwen3_moe")
    for run in obs["llm_compressor"].values():
        run["config"]["quantization_config"]["ignore"] = ["lm_head", "model.layers.1.mlp.gate"]
    with pytest.raises(derive.Inconsistent, match="is not reproduced"):
        derive.derive([obs], DECISIONS)
