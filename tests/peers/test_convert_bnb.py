"""quantd convert, a Hugging Face safetensors model -> the transformers + bitsandbytes 4-bit
layout, read back with the `safetensors` package. Here (no GPU): the layout, names, dtypes,
shapes, the quant_state JSON as bitsandbytes' unpack_tensor_to_dict reads it, the config and
the copied files, and every packed weight equal to `quantd quantize` of the same tensor. The
comparison with transformers' own quantization runs on the GPU machine (tests/consumers)."""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from conftest import ROOT, run_quantd

TINY = os.path.join(ROOT, "tests", "checkpoint", "tiny_hf.py")
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny(path, dtype="bf16", *args):
    subprocess.run([sys.executable, TINY, str(path), dtype, *map(str, args)], check=True)
    return str(path)


def load_all(d):
    out, meta = {}, {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "numpy") as f:
                meta[fn] = f.metadata()
                for k in f.keys():
                    out[k] = (fn, f.get_tensor(k))
    return out, meta


def raw(a):
    return a.view(np.uint16).tobytes() if a.dtype == ml_dtypes.bfloat16 else a.tobytes()


@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype,shards,tied", [("bf16", 1, False), ("f16", 2, False), ("f32", 3, True)])
def test_layout_and_packed_weights(tmp_path, fmt, dtype, shards, tied):
    src = tiny(tmp_path / "hf", dtype, "--shards", shards, *(["--tied"] if tied else []))
    dst = tmp_path / "q"
    run_quantd("convert", "--in", src, "--out", dst, "--fmt", fmt)
    ours, meta = load_all(dst)
    theirs, _ = load_all(src)
    assert all(m == {"format": "pt"} for m in meta.values())
    cfg = json.load(open(dst / "config.json"))
    q = cfg.pop("quantization_config")
    assert cfg == json.load(open(os.path.join(src, "config.json")))
    assert q["quant_method"] == "bitsandbytes" and q["load_in_4bit"] and q["bnb_4bit_quant_type"] == fmt
    assert isinstance(q["llm_int8_threshold"], float)  # BitsAndBytesConfig.post_init raises on an int
    assert q["bnb_4bit_use_double_quant"] and q["bnb_4bit_compute_dtype"] == {"bf16": "bfloat16", "f16": "float16",
                                                                              "f32": "float32"}[dtype]
    for fn in ("generation_config.json", "tokenizer_config.json"):
        assert open(dst / fn).read() == open(os.path.join(src, fn)).read()
    if shards > 1:
        ix = json.load(open(dst / "model.safetensors.index.json"))
        assert ix["weight_map"] == {k: v[0] for k, v in ours.items()}
        assert ix["metadata"]["total_size"] == sum(v[1].nbytes for v in ours.values())
    for name, (fn, t) in theirs.items():
        if not any(m in name for m in QUANTIZED):
            assert raw(ours[name][1]) == raw(t), name  # copied bit for bit
            continue
        w = ours[name][1]
        assert w.dtype == np.uint8 and w.shape == (t.size // 2, 1)
        js = bytes(ours[name + ".quant_state.bitsandbytes__" + fmt][1]).decode()
        state = json.loads(js)  # as bitsandbytes' unpack_tensor_to_dict reads it
        assert list(state) == ["quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype",
                               "nested_offset"]
        assert state["shape"] == list(t.shape) and state["blocksize"] == 64 and state["quant_type"] == fmt
        nb = t.size // 64
        assert ours[name + ".absmax"][1].shape == (nb,) and ours[name + ".absmax"][1].dtype == np.uint8
        assert ours[name + ".nested_absmax"][1].shape == ((nb + 255) // 256,)
        assert ours[name + ".nested_quant_map"][1].shape == (256,) and ours[name + ".quant_map"][1].shape == (16,)
        # the same bytes as quantd's tensor quantizer with the offset it wrote
        d = tmp_path / name
        d.mkdir()
        (d / "in.bin").write_bytes(raw(t))
        run_quantd("quantize", "--fmt", fmt, "--dtype", dtype, "--shape", f"{t.shape[0]},{t.shape[1]}",
                   "--in", d / "in.bin", "--out", d / "o")
        mq = json.load(open(d / "o" / "meta.json"))
        assert np.float32(state["nested_offset"]) == np.float32(mq["params"]["offset"])
        for comp, suffix in (("data", ""), ("absmax", ".absmax"), ("nested_absmax", ".nested_absmax"),
                             ("nested_quant_map", ".nested_quant_map"), ("quant_map", ".quant_map")):
            assert (d / "o" / f"{comp}.bin").read_bytes() == ours[name + suffix][1].tobytes(), (name, comp)
    assert ("lm_head.weight" in ours) == (not tied)
    assert "model.embed_tokens.weight" in ours and ours["model.embed_tokens.weight"][1].dtype != np.uint8


def test_single_file_carries_the_config_in_its_metadata(tmp_path):
    src = tiny(tmp_path / "hf")
    out = tmp_path / "q.safetensors"
    run_quantd("convert", "--in", os.path.join(src, "model.safetensors"), "--out", out, "--fmt", "nf4",
               "--param", "double_quant=false")
    with safe_open(str(out), "numpy") as f:
        q = json.loads(f.metadata()["quantization_config"])
        assert q["bnb_4bit_use_double_quant"] is False
        st = json.loads(bytes(f.get_tensor("model.layers.1.mlp.up_proj.weight.quant_state.bitsandbytes__nf4")))
        assert "nested_offset" not in st
        assert f.get_tensor("model.layers.1.mlp.up_proj.weight.absmax").dtype == np.float32


def test_bad_inputs_are_named_and_leave_nothing(tmp_path):
    src = tiny(tmp_path / "hf")
    os.rename(os.path.join(src, "config.json"), tmp_path / "config.json")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "nf4", check=False)
    assert p.returncode == 1 and "config.json" in p.stderr
    os.rename(tmp_path / "config.json", os.path.join(src, "config.json"))
    st = os.path.join(src, "model.safetensors")
    data = bytearray(open(st, "rb").read())
    for name, bad in (("length", b"\xff" * 8 + data[8:]), ("json", data[:8] + b"[" + data[9:]),
                      ("truncated", data[:-5])):
        open(st, "wb").write(bytes(bad))
        p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "nf4", check=False)
        assert p.returncode == 1 and "model.safetensors" in p.stderr, (name, p.stderr)
        assert sorted(os.listdir(tmp_path)) == ["hf"], name  # no output, no temporary directory
    # a name twice (the entries still tile the data) or a name holding \u0000 (a C reader cuts it
    # short): the file would convert into one the safetensors package refuses
    hl = int.from_bytes(data[:8], "little")
    pairs = list(json.loads(bytes(data[8:8 + hl])).items())
    names = [k for k, _ in pairs if k != "__metadata__"]
    for name, rename in (("twice", {names[1]: names[0]}), ("nul", {names[0]: names[0] + "\0x"})):
        text = "{" + ",".join(json.dumps(rename.get(k, k)) + ":" + json.dumps(v) for k, v in pairs) + "}"
        text += " " * (-len(text) % 8)
        open(st, "wb").write(len(text).to_bytes(8, "little") + text.encode() + bytes(data[8 + hl:]))
        p = run_quantd("convert", "--in", src, "--out", tmp_path / "q", "--fmt", "nf4", check=False)
        want = "appears twice" if name == "twice" else "holds a NUL character"
        assert p.returncode == 1 and want in p.stderr, (name, p.stderr)
        assert sorted(os.listdir(tmp_path)) == ["hf"], name
    open(st, "wb").write(bytes(data))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "full", "--fmt", "nf4", check=False)
    assert p.returncode == 1 and "exists and is not empty" in p.stderr and "--force" in p.stderr
