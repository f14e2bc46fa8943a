"""quantd convert, GGUF in -> GGUF out, against the `gguf` package: models written by its own
GGUFWriter, quantd's output read back by its GGUFReader, quantized tensors compared with its
numpy ports of ggml's quantize_row_*_ref. (The byte comparison with llama-quantize itself is
tests/consumers, where llama.cpp is built.)"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gguf
from conftest import QUANTD, ROOT, run_quantd

TINY = os.path.join(ROOT, "tests", "checkpoint", "tiny_gguf.py")
FMTS = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
        "q5_0": gguf.GGMLQuantizationType.Q5_0, "q5_1": gguf.GGMLQuantizationType.Q5_1,
        "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPE = {"q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q8_0": 7}


def tiny(path, dtype="f16", *args):
    subprocess.run([sys.executable, TINY, str(path), dtype, *map(str, args)], check=True)
    return str(path)


def f32_of(t):
    """A reader tensor's values as f32 (BF16 arrives as raw 16-bit words)."""
    a = np.asarray(t.data)
    if t.tensor_type == gguf.GGMLQuantizationType.BF16:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def fields(r):
    return [(f.name, [int(x) for x in f.types], bytes(np.concatenate([np.asarray(p).view(np.uint8).ravel()
                                                                      for p in f.parts]))) for f in r.fields.values()]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_convert_equals_gguf_quantizers(tmp_path, dtype, fmt):
    src = tiny(tmp_path / "in.gguf", dtype, "--ffn", 100)  # ffn_down rows of 100: F16 fallback
    out = tmp_path / "out.gguf"
    p = run_quantd("convert", "--in", src, "--out", out, "--fmt", fmt)
    assert '"summary"' in p.stdout
    r, s = gguf.GGUFReader(str(out)), gguf.GGUFReader(src)
    # every input key/value, in order, then the two llama-quantize re-sets at the end
    fin, fout = fields(s), fields(r)
    kept = [f for f in fin if f[0] not in ("general.file_type", "general.quantization_version")]
    assert fout[3:-2] == kept[3:]  # (the first three are the header's own fields)
    assert [f[0] for f in fout[-2:]] == ["general.quantization_version", "general.file_type"]
    assert int(r.fields["general.file_type"].parts[-1][0]) == FILE_TYPE[fmt]
    assert int(r.fields["general.quantization_version"].parts[-1][0]) == 2
    src_t = {t.name: t for t in s.tensors}
    names = [t.name for t in r.tensors]
    layer = [int(n.split(".")[1]) if n.startswith("blk.") else -1 for n in names]
    assert list(zip(layer, names)) == sorted(zip(layer, names))  # the loader's order
    for t in r.tensors:
        st = src_t[t.name]
        if t.name.endswith("norm.weight"):
            assert t.tensor_type == st.tensor_type and bytes(t.data) == bytes(st.data), t.name
        elif "ffn_down" in t.name:
            assert t.tensor_type == gguf.GGMLQuantizationType.F16
            assert np.array_equal(np.asarray(t.data).view(np.uint16), f32_of(st).astype(np.float16).view(np.uint16))
        else:
            assert t.tensor_type == FMTS[fmt], t.name
            ref = gguf.quants.quantize(f32_of(st), FMTS[fmt])
            assert bytes(np.asarray(t.data).view(np.uint8)) == bytes(ref.view(np.uint8)), t.name
        assert t.data_offset % 32 == 0


def test_skip_and_only_narrow_the_selection(tmp_path):
    src = tiny(tmp_path / "in.gguf")
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", src, "--out", out, "--fmt", "q8_0", "--skip", r"attn_v|^output\.",
               "--only", r"^blk\.[01]\.|output")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(out)).tensors}
    q8, f16 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16
    assert types["blk.0.attn_q.weight"] == q8 and types["blk.1.ffn_up.weight"] == q8
    assert types["blk.0.attn_v.weight"] == f16 and types["output.weight"] == f16  # --skip
    assert types["blk.2.attn_q.weight"] == f16 and types["token_embd.weight"] == f16  # not --only


def test_q8_1_and_requantizing_are_refused(tmp_path):
    src = tiny(tmp_path / "in.gguf")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "o.gguf", "--fmt", "q8_1", check=False)
    assert p.returncode == 1 and "no llama.cpp file type" in p.stderr
    run_quantd("convert", "--in", src, "--out", tmp_path / "q.gguf", "--fmt", "q8_0")
    p = run_quantd("convert", "--in", tmp_path / "q.gguf", "--out", tmp_path / "q4.gguf", "--fmt", "q4_0",
                   check=False)
    assert p.returncode == 1 and "requantizing" in p.stderr
    p = run_quantd("convert", "--in", src, "--out", src, "--fmt", "q4_0", check=False)
    assert p.returncode == 1 and "is the input" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["in.gguf", "q.gguf"]  # nothing left behind


def test_malformed_files_are_named_errors_and_leave_nothing(tmp_path):
    good = open(tiny(tmp_path / "in.gguf"), "rb").read()
    cases = {"empty": b"", "magic": b"GGML" + good[4:], "version": good[:4] + (1).to_bytes(4, "little") + good[8:],
             "swapped": good[:4] + (3 << 24).to_bytes(4, "little") + good[8:],
             "counts": good[:8] + (2 ** 62).to_bytes(8, "little") + good[16:]}
    for cut in (20, 100, 1000, 20000, len(good) - 1):
        cases[f"cut{cut}"] = good[:cut]
    # a tensor with a zero dimension (ggml's reader cannot take one; the gguf package refuses the
    # 0-byte tensor it would become): the first tensor's second dimension set to 0
    t = next(t for t in gguf.GGUFReader(tmp_path / "in.gguf").tensors if len(t.shape) == 2)
    name = t.name.encode()
    at = good.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    assert int.from_bytes(good[at:at + 4], "little") == 2
    cases["zero_dim"] = good[:at + 12] + (0).to_bytes(8, "little") + good[at + 20:]
    for name, data in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "in.gguf").write_bytes(data)
        p = run_quantd("convert", "--in", d / "in.gguf", "--out", d / "out.gguf", "--fmt", "q4_0", check=False)
        assert p.returncode == 1 and "gguf:" in p.stderr, (name, p.stderr)
        if name == "zero_dim":
            assert "dimension 1 is 0" in p.stderr, p.stderr
        assert os.listdir(d) == ["in.gguf"], name
    p = run_quantd("convert", "--in", tmp_path / "none.gguf", "--out", tmp_path / "o.gguf", "--fmt", "q4_0",
                   check=False)
    assert p.returncode == 1 and "none.gguf" in p.stderr


def test_peak_rss_follows_the_largest_tensor_not_the_model(tmp_path):
    """A ~230 MB f32 model whose largest tensor is 8 MiB: the converter's peak RSS (its own
    VmHWM, which a forked parent's pages do not inflate) is a few buffers of that tensor, far
    below the model."""
    src = tiny(tmp_path / "big.gguf", "f32", "--hidden", 1024, "--ffn", 2048, "--layers", 6)
    size = os.path.getsize(src)
    # (the CPU backend: the CUDA runtime's own ~100 MB, which a GPU machine's default adds, is
    # not the pipeline's)
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "out.gguf", "--fmt", "q8_0", "--backend", "cpu")
    peak = json.loads(p.stdout.splitlines()[-1])["summary"]["peak_rss_bytes"]  # quantd's own VmHWM
    largest = 2048 * 1024 * 4  # ffn, f32
    assert size > 150e6 and 0 < peak < min(16 * largest + 48e6, size / 2), (peak, size)
