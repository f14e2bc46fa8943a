"""quantd convert --fmt bf16|f16|f32: a quantized checkpoint back to the unquantized layout
(server/checkpoint/hf_dequant.c), against the peers' arithmetic written here in numpy:

- transformers' FineGrainedFP8 (quant_method "fp8", DeepSeek-V3 / Qwen3-FP8 layout): DeepSeek's
  fp8_cast_bf16 (weight_dequant: the e4m3 code as f32 times its 128x128 block's weight_scale_inv,
  in f32, then cast to the output dtype once), partial edge blocks included;
- compressed-tensors float-quantized / int-quantized (FP8_DYNAMIC, FP8_BLOCK, W8A8):
  compressed-tensors' decompress in a model of the output dtype (transformers' from_pretrained with
  that dtype holds the scale in it), x_q.to(scale.dtype) * scale: the scale cast to the output
  dtype, the product rounded once to it; for pack-quantized (W4A16, W8A16) the codes first
  unpacked from the int32 words (each row densely from bit 0, offset by 2^(bits-1));
- compressed-tensors nvfp4-pack-quantized / mxfp4-pack-quantized (NVFP4A16, MXFP4A16): two e2m1
  codes a byte (low nibble first) times the group's scale in f32 (NVFP4: the e4m3 scale divided
  by weight_global_scale; MXFP4: 2^(e - 127)), then the cast to the output dtype (transformers'
  bf16 model holds exactly that);
- W4A16_ASYM: the zero points unpacked down each column (packed_dim 0), x_q - zero_point exact in
  the output dtype, then as pack-quantized;
- transformers + bitsandbytes 4-bit (nf4, fp4, double quant or not): bitsandbytes 0.50's CPU
  dequantize_4bit (bnb_dequant below), then transformers' cast to the output dtype;
- AutoAWQ GEMM: AutoAWQ's dequantize_gemm (awq_dequant below), then the cast.

Round trips on every architecture of the table (AutoAWQ: those it has a model class for): the
source quantized by quantd into each layout, then back to bf16, equals the peer's dequantization
of that same directory; the scales are gone, every other tensor is the quantized directory's
bytes, and config.json is the source's
text without quantization_config, with the output's dtype (what transformers 5.17's save_pretrained
writes for the model loaded with dequantize=True: checked byte for byte on the Llama, see
docs/convert.md). A source that is not quantized, or quantized in a layout not read back, is
refused naming what is."""
import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from conftest import FIXTURES, load_safetensors_dir, run_quantd

import sys
sys.path.insert(0, os.path.join(os.path.dirname(FIXTURES), "checkpoint"))
import tiny_hf  # noqa: E402

SOURCES = os.path.join(FIXTURES, "arch")
NAMES = sorted(fn[:-len(".json")] for fn in os.listdir(SOURCES) if fn.endswith(".json") and fn != "decisions.json")
LAYOUTS = {"FP8_DYNAMIC": ["--fmt", "fp8_e4m3"],
           "FP8_BLOCK": ["--fmt", "fp8_e4m3", "--param", "granularity=block"],
           "W8A8": ["--fmt", "w8a8"],
           "FineGrainedFP8": ["--fmt", "fp8_e4m3", "--param", "flow=transformers"],
           "W4A16": ["--fmt", "w4a16"],
           "W8A16": ["--fmt", "w8a16"],
           "W4A16_ASYM": ["--fmt", "w4a16", "--param", "symmetric=false"],
           "NVFP4A16": ["--fmt", "nvfp4"],
           "MXFP4A16": ["--fmt", "mxfp4"],
           "nf4": ["--fmt", "nf4"],
           "fp4": ["--fmt", "fp4"],
           "nf4-single": ["--fmt", "nf4", "--param", "double_quant=false"],
           "fp4-single": ["--fmt", "fp4", "--param", "double_quant=false"],
           "AWQ": ["--fmt", "awq"]}
OUT = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}
TORCH = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name.replace(".", "_"))
            with open(os.path.join(SOURCES, name + ".json")) as f:
                tiny_hf.write_arch(json.load(f)["source"], made[name])
        return made[name]
    return get


def grid(scale, rows, cols, block):
    """The scale of every element: per tensor, per row or per block (a MoE expert's FineGrainedFP8
    grid may be saved 1-D)."""
    s = scale.astype(np.float32)
    br, bc = block
    if s.ndim == 1 and s.size > 1:
        s = s.reshape(-1, 1) if -(-rows // br) == s.size else s.reshape(1, -1)
    s = s.reshape(s.shape[0] if s.ndim == 2 else 1, -1)
    r = 1 if s.shape[0] == rows else rows if s.shape[0] == 1 else br
    c = 1 if s.shape[1] == cols else cols if s.shape[1] == 1 else bc
    return np.repeat(np.repeat(s, r, 0), c, 1)[:rows, :cols]


def peer_dequant(q, scale, block, finegrained, out):
    codes = q.astype(np.float32)  # e4m3 and int8 are exact in f32 (and in bf16 / f16)
    if not finegrained:  # the scale parameter in the model's dtype
        scale = scale.astype(out)
    # f32 products (fp8_cast_bf16 multiplies in f32; a bf16/f16 product of an exact code is exact
    # in f32 too), then one rounding to the output dtype
    return (codes * grid(scale, q.shape[0], q.shape[1], block)).astype(out)


def block_of(cfg):
    q = cfg["quantization_config"]
    weights = [g["weights"] for g in q.get("config_groups", {}).values()]
    b = q.get("weight_block_size") or next((w["block_structure"] for w in weights if w.get("block_structure")), None)
    if not b and weights and weights[0].get("group_size"):
        b = (1, weights[0]["group_size"])
    return tuple(b or (128, 128))


def unpack(words, bits, shape):
    """compressed-tensors' unpack_from_int32 (packed_dim 1): code c of a row at bits c*bits of its
    words, less 2^(bits-1)."""
    w = words.view(np.uint32).astype(np.uint64)
    c = np.arange(shape[1])
    word, shift = (c * bits) // 32, (c * bits) % 32
    return ((w[:, word] >> shift.astype(np.uint64)) & ((1 << bits) - 1)).astype(np.int64) - (1 << (bits - 1))


def convert_back(tmp_path, src, layout, to):
    q, back = tmp_path / "q", tmp_path / to
    run_quantd("convert", "--in", src, "--out", q, "--backend", "cpu", *LAYOUTS[layout])
    p = run_quantd("convert", "--in", q, "--out", back, "--fmt", to, "--backend", "cpu")
    return q, back, json.loads(p.stdout.splitlines()[-1])["summary"]


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def fp4_dequant(packed, scale, global_scale, group, out):
    codes = np.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
    if global_scale is None:  # e8m0
        s = np.ldexp(np.float32(1), scale.astype(np.int32) - 127).astype(np.float32)
    else:
        s = scale.astype(np.float32) / global_scale.astype(np.float32)
    return (E2M1[codes] * np.repeat(s, group, 1)).astype(out)


BNB_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def bnb_dequant(qt, w, out):
    """bitsandbytes 0.50's dequantize_4bit on the CPU, then transformers' .to(dtype): two codes a
    byte (the first in the high nibble) of the flattened weight; with double quant the absmax is
    nested_quant_map[code] * nested_absmax (per 256 blocks) + nested_offset, each in f32; the
    value (bitsandbytes' table, which is the file's quant_map) times the block's absmax in f32,
    rounded to the quant_state's dtype, then cast to the output dtype."""
    qs = next(k for k in qt if k.startswith(w + ".quant_state.bitsandbytes__"))
    st = json.loads(bytes(qt[qs]).decode())
    n, bs = st["shape"][0] * st["shape"][1], st["blocksize"]
    data = qt[w].reshape(-1)
    codes = np.stack([data >> 4, data & 15], -1).reshape(-1)[:n]
    absmax = qt[w + ".absmax"]
    if "nested_offset" in st:
        absmax = qt[w + ".nested_quant_map"][absmax] * np.repeat(qt[w + ".nested_absmax"], 256)[:absmax.size]
        absmax = (absmax + np.float32(st["nested_offset"])).astype(np.float32)
    v = qt[w + ".quant_map"].astype(np.float32)[codes] * np.repeat(absmax, bs)[:n]
    return v.astype(BNB_DTYPE[st["dtype"]]).astype(out).reshape(st["shape"])


AWQ_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]  # column 8j + k of a word sits in nibble AWQ_NIBBLE[k]


def awq_unpack(words):
    w = words.view(np.uint32)
    shifts = np.array([4 * AWQ_NIBBLE[k] for k in range(8)], np.uint32)
    return ((w[:, :, None] >> shifts) & 15).reshape(w.shape[0], -1).astype(np.int32)


def awq_dequant(qweight, qzeros, scales, group, out):
    """AutoAWQ's dequantize_gemm: nibbles back in column order, (q - z) * scale as a torch f16
    op (the product of exact values rounded once to f16), [in, out] transposed to the Linear's
    [out, in], then the cast to the output dtype."""
    d = awq_unpack(qweight) - np.repeat(awq_unpack(qzeros), group, 0)
    v = (d.astype(np.float32) * np.repeat(scales, group, 0).astype(np.float32)).astype(np.float16)
    return np.ascontiguousarray(v.T).astype(out)


def check_family(q, back, to, cfg):
    """bitsandbytes and AutoAWQ: each quantized weight's components become <m>.weight, equal to
    the peer's dequantization; every other tensor is the quantized directory's bytes."""
    qt, ours = load_safetensors_dir(q), load_safetensors_dir(back)
    want, dropped = {}, set()
    if cfg["quantization_config"]["quant_method"] == "bitsandbytes":
        for k in [k for k in qt if ".quant_state.bitsandbytes__" in k]:
            w = k[:k.index(".quant_state.")]
            want[w] = bnb_dequant(qt, w, OUT[to])
            dropped |= {k} | {w + s for s in (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map")}
    else:
        group = cfg["quantization_config"]["group_size"]
        for k in [k for k in qt if k.endswith(".qweight")]:
            m = k[:-len(".qweight")]
            want[m + ".weight"] = awq_dequant(qt[k], qt[m + ".qzeros"], qt[m + ".scales"], group, OUT[to])
            dropped |= {k, m + ".qzeros", m + ".scales"}
    assert want and sorted(ours) == sorted((set(qt) - dropped) | set(want))
    for k, v in ours.items():
        if k in want:
            assert v.dtype == want[k].dtype and v.shape == want[k].shape, k
            assert v.tobytes() == want[k].tobytes(), \
                f"{k}: {np.count_nonzero(v.view(np.uint8) != want[k].view(np.uint8))} bytes differ"
        else:
            assert v.dtype == qt[k].dtype and v.tobytes() == qt[k].tobytes(), k
    return cfg


def check_equal(q, back, to):
    cfg = json.loads((q / "config.json").read_text())
    if cfg["quantization_config"]["quant_method"] in ("bitsandbytes", "awq"):
        return check_family(q, back, to, cfg)
    fmt = cfg["quantization_config"].get("format", "")
    if fmt.endswith("fp4-pack-quantized"):
        qt, ours = load_safetensors_dir(q), load_safetensors_dir(back)
        group = next(iter(cfg["quantization_config"]["config_groups"].values()))["weights"]["group_size"]
        mods = [k[:-len(".weight_packed")] for k in qt if k.endswith(".weight_packed")]
        dropped = {m + s for m in mods for s in (".weight_packed", ".weight_scale", ".weight_global_scale")}
        assert sorted(ours) == sorted((set(qt) - dropped) | {m + ".weight" for m in mods})
        for k, v in ours.items():
            m = k[:-len(".weight")]
            if m in mods:
                want = fp4_dequant(qt[m + ".weight_packed"], qt[m + ".weight_scale"],
                                   qt.get(m + ".weight_global_scale"), group, OUT[to])
                assert v.dtype == want.dtype and v.tobytes() == want.tobytes(), k
            else:
                assert v.dtype == qt[k].dtype and v.tobytes() == qt[k].tobytes(), k
        assert mods
        return cfg
    finegrained = cfg["quantization_config"]["quant_method"] == "fp8"
    packed = cfg["quantization_config"].get("format") == "pack-quantized"
    suffix = ".weight_scale_inv" if finegrained else ".weight_scale"
    qt, ours = load_safetensors_dir(q), load_safetensors_dir(back)
    scales = {k for k in qt if k.endswith(suffix)}
    if packed:  # <m>.weight_packed, weight_scale, weight_shape (, weight_zero_point) -> <m>.weight
        bits = next(iter(cfg["quantization_config"]["config_groups"].values()))["weights"]["num_bits"]
        for k in [k for k in qt if k.endswith(".weight_packed")]:
            m = k[:-len("_packed")]
            shape = tuple(qt.pop(m + "_shape"))
            qt[m] = unpack(qt.pop(k), bits, shape)
            if m + "_zero_point" in qt:  # packed down each column (packed_dim 0), then x_q - zp
                zp = qt.pop(m + "_zero_point")
                zp = unpack(np.ascontiguousarray(zp.T), bits, (zp.shape[1], shape[0])).T
                qt[m] = (qt[m], np.repeat(zp, shape[1] // zp.shape[1], 1))
    assert sorted(ours) == sorted(set(qt) - scales)  # the zero points are gone too
    converted = 0
    for k, v in ours.items():
        if k + suffix[len(".weight"):] in qt and k.endswith(".weight"):
            codes = qt[k][0] - qt[k][1] if isinstance(qt[k], tuple) else qt[k]  # exact in every dtype
            want = peer_dequant(codes, qt[k + suffix[len(".weight"):]], block_of(cfg), finegrained, OUT[to])
            assert v.dtype == want.dtype and v.shape == want.shape, k
            assert v.tobytes() == want.tobytes(), f"{k}: {np.count_nonzero(v.view(np.uint8) != want.view(np.uint8))} bytes differ"
            converted += 1
        else:
            assert v.dtype == qt[k].dtype and v.tobytes() == qt[k].tobytes(), k
    assert converted == len(scales) > 0
    return cfg


def expected_config(q, to):
    """The quantized directory's config.json without quantization_config, with "dtype" the
    output's (transformers' save_pretrained); every other key as it is."""
    src = json.loads((q / "config.json").read_text())
    src.pop("quantization_config")
    src["dtype"] = TORCH[to]
    return src


def awq_supported(name):
    """AutoAWQ has a model class for the architecture (the table's observation; quantd writes
    AWQ for those)."""
    with open(os.path.join(SOURCES, name + ".json")) as f:
        return json.load(f)["autoawq"]["supported"]


CASES = [(n, l) for n in NAMES for l in LAYOUTS if l != "AWQ" or awq_supported(n)]


@pytest.mark.parametrize("name,layout", CASES, ids=[f"{n}-{l}" for n, l in CASES])
def test_round_trip_bf16(tmp_path, source, name, layout):
    q, back, summary = convert_back(tmp_path, source(name), layout, "bf16")
    check_equal(q, back, "bf16")
    assert summary["fmt"] == "bf16" and summary["quantized"] > 0
    assert json.loads((back / "config.json").read_text()) == expected_config(q, "bf16")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("to", ["f16", "f32"])
def test_other_dtypes(tmp_path, source, layout, to):
    q, back, _ = convert_back(tmp_path, source("deepseek_v3"), layout, to)
    check_equal(q, back, to)
    assert json.loads((back / "config.json").read_text()) == expected_config(q, to)


@pytest.mark.parametrize("layout", ["nf4", "fp4-single", "W4A16_ASYM"])
@pytest.mark.parametrize("src_dtype", ["float16", "float32"])
def test_source_dtypes(tmp_path, source, layout, src_dtype):
    """A float16 or float32 source: bitsandbytes dequantizes into the quant_state's dtype (the
    source's) before the cast to bf16, compressed-tensors into bf16 directly."""
    src = tmp_path / "src"
    shutil.copytree(source("llama"), src)
    t = load_safetensors_dir(src)
    save_file({k: v.astype(np.float32).astype(np.dtype(src_dtype)) for k, v in t.items()},
              str(src / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "dtype": src_dtype}))
    q, back, _ = convert_back(tmp_path, src, layout, "bf16")
    if layout != "W4A16_ASYM":
        assert src_dtype in next(bytes(v).decode() for k, v in load_safetensors_dir(q).items() if "quant_state" in k)
    check_equal(q, back, "bf16")


def test_config_bytes_are_transformers_save(tmp_path, source):
    """The Llama's source config.json is transformers' own save (dtype bfloat16); its
    dequantized save writes the same text back, so bf16 out is the source's bytes."""
    src = source("llama")
    for layout in [l for l in LAYOUTS if l != "AWQ"]:  # AutoAWQ's saved config says use_cache false
        (tmp_path / layout).mkdir()
        _, back, _ = convert_back(tmp_path / layout, src, layout, "bf16")
        assert (back / "config.json").read_bytes() == (src / "config.json").read_bytes(), layout


def test_refusals(tmp_path, source):
    src = source("llama")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "a", "--fmt", "bf16", check=False)
    assert p.returncode == 1 and "not quantized" in p.stderr and "FineGrainedFP8" in p.stderr, p.stderr
    q = tmp_path / "nv"
    run_quantd("convert", "--in", src, "--out", q, "--fmt", "nf4", "--backend", "cpu")
    cfg = json.loads((q / "config.json").read_text())
    for method, edit, says in [("gptq", {"quant_method": "gptq"}, "'gptq'"),
                               ("8-bit", {"load_in_4bit": False, "load_in_8bit": True}, "load_in_4bit is not true")]:
        other = tmp_path / method
        other.mkdir()
        (other / "model.safetensors").symlink_to(q / "model.safetensors")
        (other / "config.json").write_text(json.dumps({**cfg, "quantization_config": {**cfg["quantization_config"],
                                                                                      **edit}}))
        p = run_quantd("convert", "--in", other, "--out", tmp_path / "b", "--fmt", "BF16", check=False)
        assert p.returncode == 1 and says in p.stderr and "float-quantized" in p.stderr, p.stderr
    asym = tmp_path / "asym"
    run_quantd("convert", "--in", src, "--out", asym, "--fmt", "w4a16", "--param", "symmetric=false", "--backend", "cpu")
    t = load_safetensors_dir(asym)  # a zero point missing: its weight cannot be turned back
    del t[next(k for k in t if k.endswith(".weight_zero_point"))]
    save_file(t, str(asym / "model.safetensors"), metadata={"format": "pt"})
    p = run_quantd("convert", "--in", asym, "--out", tmp_path / "b", "--fmt", "bf16", check=False)
    assert p.returncode == 1 and "needs its weight_zero_point" in p.stderr, p.stderr
    assert not (tmp_path / "b").exists()
    p = run_quantd("convert", "--in", q, "--out", tmp_path / "c", "--fmt", "bf16", "--param", "x=1", check=False)
    assert p.returncode == 2 and "--param does not apply to --fmt bf16 (back to float)" in p.stderr, p.stderr
    p = run_quantd("convert", "--in", q, "--out", tmp_path / "e", "--fmt", "bf16", "--skip", "q_proj", check=False)
    assert p.returncode == 1 and "every quantized weight back" in p.stderr, p.stderr
    p = run_quantd("convert", "--in", q / "model.safetensors", "--out", tmp_path / "d.safetensors", "--fmt", "f32",
                   check=False)
    assert p.returncode == 1 and "model directory" in p.stderr, p.stderr


WIDE_FFN = 8320  # 65 groups of 128; the gate/up rows split between two threads mid-block


@pytest.fixture(scope="module")
def wide_source(tmp_path_factory):
    """The Llama with an FFN wide enough that a weight's rows are spread over threads (spans of
    at least 1 Mi outputs: [8320, 256] and [256, 8320] make two), the cut inside a 128-row block."""
    with open(os.path.join(SOURCES, "llama.json")) as f:
        spec = json.load(f)["source"]
    spec["files"]["config.json"] = spec["files"]["config.json"].replace(
        '"intermediate_size": 512', f'"intermediate_size": {WIDE_FFN}')
    for name, e in spec["tensors"].items():
        e["shape"] = [WIDE_FFN if d == 512 else d for d in e["shape"]]
    out = tmp_path_factory.mktemp("wide")
    tiny_hf.write_arch(spec, out)
    return out


@pytest.mark.parametrize("layout", ["FineGrainedFP8", "FP8_BLOCK", "W4A16", "NVFP4A16", "nf4", "fp4-single", "AWQ"])
def test_wide_weights_spread_over_threads(tmp_path, wide_source, layout):
    q, back, _ = convert_back(tmp_path, wide_source, layout, "bf16")
    check_equal(q, back, "bf16")
