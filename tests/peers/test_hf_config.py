"""config.json of every Hugging Face layout, byte for byte as the layout's tool writes it:
json.dumps(config, indent=2, sort_keys=True), plus "\\n" where transformers' save_pretrained writes
the file (bitsandbytes, AutoAWQ; llm-compressor rewrites it with json.dump, no newline), every
source key with its value's JSON type and spelling (transformers 5.17 validates config field
types when it loads: Gemma-2's `final_logit_softcapping: 30.0` written back as `30` fails to
load), quantization_config added."""
import json

import pytest

from conftest import run_quantd, tiny_hf

# The config fields that broke: floats with integral values, at the top and nested; and the
# other JSON shapes a config holds (exponents, -0.0, big ints, nulls, lists, unicode, escapes),
# in an order save_pretrained would sort.
HARD = {
    "model_type": "llama",
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "router_jitter_noise": 0.0,
    "embd_pdrop": 0.0,
    "rms_norm_eps": 1e-06,
    "rope_theta": 500000.0,
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "huge": 12345678901234567890,
    "negative_zero": -0.0,
    "tiny": 5e-324,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "rope_type": "llama3", "high_freq_factor": 4.0},
    "layer_types": ["sliding_attention", "full_attention"],
    "eos_token_id": [128001, 128008],
    "pad_token_id": None,
    "tie_word_embeddings": False,
    "architectures": ["LlamaForCausalLM"],
    "name": "caf\u00e9 \u2014 \"quoted\" \\ tab\t \U0001F600",
    "empty": {},
    "none_list": [],
    "quantization_config": {"quant_method": "stale"},
}


# the text's end, per layout
NEWLINE = {"nf4": "\n", "w4a16": "", "w8a16": "", "nvfp4": "", "awq": "\n"}


@pytest.mark.parametrize("fmt", sorted(NEWLINE))
def test_config_written_as_save_pretrained(tmp_path, fmt):
    src = tiny_hf(tmp_path / "hf", "bf16", "--layers", 1)
    base = json.load(open(src / "config.json"))
    cfg = {**base, **HARD}
    # the source as a person may have it: unsorted, other indentation
    (src / "config.json").write_text(json.dumps(cfg, indent=4, ensure_ascii=False))
    dst = tmp_path / "q"
    run_quantd("convert", "--in", src, "--out", dst, "--fmt", fmt)
    text = (dst / "config.json").read_text()
    ours = json.loads(text)
    want = dict(cfg)
    want["quantization_config"] = ours["quantization_config"]  # its content: the layout tests
    assert ours["quantization_config"] != HARD["quantization_config"]
    if fmt == "awq":  # AutoAWQ saves its float16 model, loaded with use_cache=False
        for key in ("torch_dtype", "dtype"):
            if key in want:
                want[key] = "float16"
        want["use_cache"] = False
    assert text == json.dumps(want, indent=2, sort_keys=True) + NEWLINE[fmt]


def test_config_types_survive(tmp_path):
    """The fields transformers 5.17 checks: a float stays a float, an int an int."""
    src = tiny_hf(tmp_path / "hf", "bf16", "--layers", 1)
    cfg = {**json.load(open(src / "config.json")), **HARD}
    (src / "config.json").write_text(json.dumps(cfg))
    run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "nf4")
    ours = json.load(open(tmp_path / "q" / "config.json"))
    for key, value in cfg.items():
        if key != "quantization_config":
            assert type(ours[key]) is type(value) and ours[key] == value, key
    assert type(ours["rope_scaling"]["factor"]) is float
