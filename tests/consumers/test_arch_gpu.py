"""Every architecture of the table on a CUDA GPU (skipped elsewhere), the observation's tiny source
(tests/checkpoint/tiny_hf.py --arch):

- quantd convert writes the same bytes on the CUDA backend as on the CPU backend, for every layout
  (nf4, fp4, W4A16, W4A16_ASYM, W8A16, NVFP4A16, MXFP4A16, and AutoAWQ where the table has it);
- transformers + bitsandbytes itself (BitsAndBytesConfig nf4 / fp4, double quant, compute bf16, on
  the GPU) + save_pretrained against quantd's directory: the same tensor names; identical packed
  weights, quant maps and copied tensors; the quant_state JSON equal but for the double-quant offset
  (torch's CUDA mean, which can differ from quantd's exact mean in the last bit), and the absmax
  codes identical wherever that offset is; transformers loads quantd's directory with nothing
  missing or unexpected, and its logits equal the reference model's (within the absmax codes' effect
  where an offset differs; the count is printed)."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from conftest import QUANTD, torch_tensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
import tiny_hf  # noqa: E402

ARCH_DIR = os.path.join(HERE, "..", "fixtures", "arch")
OBSERVATIONS = {}
for fn in sorted(os.listdir(ARCH_DIR)):
    if fn.endswith(".json") and fn != "decisions.json":
        o = json.load(open(os.path.join(ARCH_DIR, fn)))
        OBSERVATIONS[o["name"]] = o
LAYOUTS = {"nf4": ["nf4"], "fp4": ["fp4"], "W4A16": ["w4a16"], "W4A16_ASYM": ["w4a16", "--param", "symmetric=false"],
           "W8A16": ["w8a16"], "NVFP4A16": ["nvfp4"], "MXFP4A16": ["mxfp4"], "awq": ["awq"],
           "FP8_DYNAMIC": ["fp8_e4m3"], "FP8_BLOCK": ["fp8_e4m3", "--param", "granularity=block"], "W8A8": ["w8a8"],
           "FineGrainedFP8": ["fp8_e4m3", "--param", "flow=transformers"]}
CPU_CUDA = [(n, lay) for n, o in OBSERVATIONS.items() for lay in LAYOUTS if lay != "awq" or o["autoawq"]["supported"]]
BNB = [(n, fmt) for n in OBSERVATIONS for fmt in ("nf4", "fp4")]


def convert(src, dst, fmt_args, backend):
    subprocess.run([QUANTD, "convert", "--in", str(src), "--out", str(dst), "--fmt", *fmt_args, "--backend", backend],
                   check=True, stdout=subprocess.DEVNULL)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("name,layout", CPU_CUDA, ids=[f"{n}-{lay}" for n, lay in CPU_CUDA])
def test_cuda_backend_writes_the_cpu_bytes(tmp_path, name, layout):
    src = tmp_path / "src"
    tiny_hf.write_arch(OBSERVATIONS[name]["source"], src)
    convert(src, tmp_path / "cpu", LAYOUTS[layout], "cpu")
    convert(src, tmp_path / "cuda", LAYOUTS[layout], "cuda")
    a, b = torch_tensors(tmp_path / "cpu"), torch_tensors(tmp_path / "cuda")
    assert sorted(a) == sorted(b)
    assert [k for k in a if not same(a[k], b[k])] == []
    assert (tmp_path / "cpu" / "config.json").read_text() == (tmp_path / "cuda" / "config.json").read_text()


@pytest.mark.parametrize("name,fmt", BNB, ids=[f"{n}-{f}" for n, f in BNB])
def test_transformers_bnb_loads_quantd_like_its_own(tmp_path, name, fmt):
    obs = OBSERVATIONS[name]
    src, ref, ours = tmp_path / "src", tmp_path / "ref", tmp_path / "ours"
    tiny_hf.write_arch(obs["source"], src)
    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=fmt, bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.bfloat16)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(str(src), quantization_config=cfg, device_map="cuda",
                                                                  dtype=torch.bfloat16)
    ref_model.save_pretrained(str(ref))
    convert(src, ours, [fmt], "cuda")
    a, b = torch_tensors(ref), torch_tensors(ours)
    assert sorted(a) == sorted(b)
    modules = [k[:-len(".weight")] for k in a if k.endswith(".weight") and k + ".absmax" in a]
    offset_differs = 0
    for m in modules:
        for s in (".weight", ".weight.quant_map", ".weight.nested_quant_map"):
            assert same(a[m + s], b[m + s]), f"{m}{s} differs"
        qa = json.loads(bytes(a[m + ".weight.quant_state.bitsandbytes__" + fmt].tolist()))
        qb = json.loads(bytes(b[m + ".weight.quant_state.bitsandbytes__" + fmt].tolist()))
        assert {k: v for k, v in qa.items() if k != "nested_offset"} == {k: v for k, v in qb.items() if k != "nested_offset"}
        if qa["nested_offset"] != qb["nested_offset"]:
            offset_differs += 1
            continue
        for s in (".absmax", ".nested_absmax"):
            assert same(a[m + ".weight" + s], b[m + ".weight" + s]), f"{m}{s} differs with the same offset"
    for k in a:
        if not any(k.startswith(m + ".weight") for m in modules):
            assert same(a[k], b[k]), f"{k}: a tensor bitsandbytes does not quantize differs"
    ours_model, info = transformers.AutoModelForCausalLM.from_pretrained(str(ours), device_map="cuda",
                                                                         dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = torch.randint(0, obs["config_arguments"]["vocab_size"], (2, 16), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(5))
    with torch.no_grad():
        la, lb = ref_model(ids).logits.float(), ours_model(ids).logits.float()
    diff = (la - lb).abs().max().item()
    print(f"\n{name} {fmt}: {len(modules)} modules, double-quant offset differs in {offset_differs}; logits max |diff| "
          f"{diff:.3g} (scale {la.abs().max().item():.3g})")
    if offset_differs == 0:
        assert diff == 0.0
    else:  # the absmax of those modules may move by a code of the 8-bit map
        assert diff < 0.05 * la.abs().max().item()
