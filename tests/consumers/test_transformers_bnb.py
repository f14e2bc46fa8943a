"""quantd convert against transformers + bitsandbytes themselves (a GPU machine with torch,
transformers and bitsandbytes): a tiny random Llama (bf16, two shards) quantized by
transformers' own BitsAndBytesConfig path and saved with save_pretrained, against quantd's
directory from the same weights. Every quantized module's packed weight must be identical; the
absmax codes are identical wherever the double-quant offset is (quantd's offset is the exact
mean of the absmax, bitsandbytes' is torch's CUDA mean, which can differ in the last bit: the
test prints how many modules differ). transformers loads quantd's directory, and its logits on
a fixed input are compared with the reference model's."""
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
TINY = os.path.join(os.path.dirname(__file__), "..", "checkpoint", "tiny_hf.py")


@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_transformers_loads_quantd_and_weights_match(tmp_path, fmt, backend):
    src = tmp_path / "hf"
    subprocess.run([sys.executable, TINY, str(src), "bf16", "--shards", "2"], check=True)
    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=fmt, bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.bfloat16)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(str(src), quantization_config=cfg, device_map="cuda",
                                                                  dtype=torch.bfloat16)
    ref = tmp_path / "ref"
    ref_model.save_pretrained(str(ref))
    ours = tmp_path / "ours"
    subprocess.run([QUANTD, "convert", "--in", str(src), "--out", str(ours), "--fmt", fmt, "--backend", backend],
                   check=True, stdout=subprocess.DEVNULL)
    a, b = torch_tensors(ref), torch_tensors(ours)
    assert set(a) == set(b)
    modules = [k[:-len(".weight")] for k in a if k.endswith(".weight") and k + ".absmax" in a]
    offset_differs = 0
    for m in modules:
        assert torch.equal(a[m + ".weight"], b[m + ".weight"]), f"{m}: packed weight differs"
        qa = json.loads(bytes(a[m + ".weight.quant_state.bitsandbytes__" + fmt].tolist()))
        qb = json.loads(bytes(b[m + ".weight.quant_state.bitsandbytes__" + fmt].tolist()))
        assert {k: v for k, v in qa.items() if k != "nested_offset"} == {k: v for k, v in qb.items() if k != "nested_offset"}
        if qa["nested_offset"] != qb["nested_offset"]:
            offset_differs += 1
            continue
        for s in (".absmax", ".nested_absmax", ".nested_quant_map", ".quant_map"):
            assert torch.equal(a[m + ".weight" + s], b[m + ".weight" + s]), f"{m}{s} differs with the same offset"
    for k in a:
        if not any(k.startswith(m + ".weight") for m in modules):
            assert torch.equal(a[k], b[k]), f"{k}: copied tensor differs"
    ours_model = transformers.AutoModelForCausalLM.from_pretrained(str(ours), device_map="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([[1, 17, 300, 42, 99, 5, 260, 311]], device="cuda")
    with torch.no_grad():
        la, lb = ref_model(ids).logits.float(), ours_model(ids).logits.float()
    diff = (la - lb).abs().max().item()
    print(f"\n{fmt} {backend}: {len(modules)} modules, packed weights identical in all, double-quant offset "
          f"differs in {offset_differs}; logits max |diff| {diff:.3g} (scale {la.abs().max().item():.3g})")
    if offset_differs == 0:
        assert diff == 0.0
    else:  # the absmax of those modules may move by a code of the 8-bit map
        assert diff < 0.05 * la.abs().max().item()
