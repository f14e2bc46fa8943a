"""The forward engine and quantd perplexity against llama.cpp's recorded figures
(tests/fixtures/model/, made by tests/fixtures/make_model_fixtures.py; the live comparison is
tests/consumers/test_llama_cpp_model.py). For each tiny model (tests/model/cases.py: Llama
untied, tied, with Llama 3's rope_freqs, with GQA; Qwen2 with q/k/v biases; Qwen3 with q/k norms
and a head size apart from n_embd / n_head; Gemma 2 with soft-capped scores and logits and a
sliding window of 8 on alternate blocks; Gemma 3 with q/k norms, 2 sliding blocks of 3 with their
own rope base, linear rope scaling on the global one; Phi-3 with fused qkv and gate/up, and with
LongRoPE's long factors, its attention factor and q/k/v biases; Mistral 3 with output and FFN
biases; the mixtures of experts Mixtral, qwen2moe with its shared expert, qwen3moe, 8 experts
with 2 or 4 a token; deepseek2 in DeepSeek V2's layout and in V3's, tests/model/cases.py):
- the logits of llama.cpp's f32 path (f32 KV cache, no flash attention) within a relative 1e-4
  (per row: the largest difference over the row's largest logit), quantd run the same way
  (-ctk f32 -ctv f32);
- the mean negative log-likelihood (ln PPL) equal to llama-perplexity's within a relative 1e-5
  on that path, and within 1e-4 of llama-perplexity's run with its defaults (an f16 KV cache,
  which quantd's default emulates; 1e-3 for the mixtures of experts, whose routing may flip on a
  near tie there: tests/model/cases.py);
- llama-perplexity's running line ("[1]x,[2]y,...": the perplexity after each chunk) within a
  relative 1e-5 on the f32 path.
And the command's refusals: too few tokens, an architecture the engine lacks, a model without
a vocabulary, token ids outside the vocabulary, a malformed token file."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from cases import CASES, FIXTURES, MOE_CASES, MOE_DEFAULT_LN_PPL_TOLERANCE, N_CTX, make_model, read_logits  # noqa: E402,E501

QUANTD = os.environ.get("QUANTD", os.path.join(HERE, "..", "..", "bin", "quantd"))
TOKENS = os.path.join(FIXTURES, "tokens.bin")


def fixture(case):
    with open(os.path.join(FIXTURES, case + ".json")) as f:
        return json.load(f)


def perplexity(model, *extra, tokens=TOKENS, check=True):
    p = subprocess.run([QUANTD, "perplexity", "-m", str(model), "--tokens", str(tokens), "-c", str(N_CTX), "-t", "2",
                        *map(str, extra)], capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def summary(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {case: make_model(case, d / (case + ".gguf")) for case in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_perplexity_equal_llama_cpp_f32(models, tmp_path, case):
    rec = fixture(case)
    dump = tmp_path / "logits.bin"
    p = perplexity(models[case], "-ctk", "f32", "-ctv", "f32", "--dump-logits", dump)
    s = summary(p)
    n_vocab = rec["n_vocab"]
    ours = read_logits(dump, n_vocab).reshape(rec["chunks"], N_CTX - N_CTX // 2, n_vocab)
    ref = np.fromfile(os.path.join(FIXTURES, case + ".logits.bin"), dtype=np.float32).reshape(-1, n_vocab)
    worst = 0.0
    for (c, r), want in zip(rec["logit_rows"], ref):
        rel = float(np.abs(ours[c, r].astype(np.float64) - want).max() / np.abs(want).max())
        worst = max(worst, rel)
    print(f"{case}: logits' worst row relative error {worst:.2e}")
    assert worst < 1e-4
    ln_ref = math.log(rec["f32"]["ppl"])
    assert abs(s["ln_ppl"] - ln_ref) / ln_ref < 1e-5, (s["ln_ppl"], ln_ref)
    # the running line: each chunk's perplexity so far, as llama-perplexity prints it
    ours_line = [float(x.split("]")[1]) for x in p.stdout.strip().splitlines()[0].rstrip(",").split(",")]
    ref_line = [float(x.split("]")[1]) for x in rec["f32"]["line"].rstrip(",").split(",")]
    assert len(ours_line) == len(ref_line) == rec["chunks"]
    assert max(abs(math.log(a / b)) for a, b in zip(ours_line, ref_line)) < 1e-5
    assert s["tokens_scored"] == rec["chunks"] * (N_CTX - N_CTX // 2 - 1)
    assert "Final estimate: PPL = " in p.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_perplexity_equals_llama_perplexity_defaults(models, case):
    rec = fixture(case)
    s = summary(perplexity(models[case]))
    ln_ref = math.log(rec["default"]["ppl"])
    rel = abs(s["ln_ppl"] - ln_ref) / ln_ref
    print(f"{case}: ln PPL {s['ln_ppl']:.6f} against llama-perplexity's default {ln_ref:.6f}: {rel:.2e}")
    # experts' routing flips on near ties off the f32 path (cases.py)
    assert rel < (MOE_DEFAULT_LN_PPL_TOLERANCE if case in MOE_CASES else 1e-4)
    assert s["cache_type_k"] == "f16" and s["memory"]["peak_bytes"] > 0


def test_summary_states_memory_and_chunks(models):
    s = summary(perplexity(models["llama-gqa"], "--chunks", "3"))
    assert s["chunks"] == 3 and s["tokens_scored"] == 3 * (N_CTX // 2 - 1)
    m = s["memory"]
    assert m["hidden_bytes"] == 3 * N_CTX * 64 * 4  # [chunks][n_ctx][n_embd] f32
    assert m["peak_bytes"] == m["hidden_bytes"] + max(m["block_bytes"] + m["scratch_bytes"], m["head_bytes"])


def test_json_token_file_equals_binary(models, tmp_path):
    ids = np.fromfile(TOKENS, dtype=np.int32)
    j = tmp_path / "tokens.json"
    j.write_text(json.dumps(ids.tolist()))
    a = summary(perplexity(models["llama-tied"], "--chunks", "2"))
    b = summary(perplexity(models["llama-tied"], "--chunks", "2", tokens=j))
    assert a["ln_ppl"] == b["ln_ppl"]


def test_text_equals_its_token_ids(models):
    """-f TEXT: quantd's tokenizer makes llama-tokenize's ids of the text (tokens.bin was made by
    it), so the figures are those of --tokens."""
    p = subprocess.run([QUANTD, "perplexity", "-m", str(models["llama-tied"]), "-f", os.path.join(FIXTURES, "text.txt"),
                        "-c", str(N_CTX), "-t", "2", "--chunks", "2"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert summary(p)["ln_ppl"] == summary(perplexity(models["llama-tied"], "--chunks", "2"))["ln_ppl"]


def test_refusals(models, tmp_path):
    short = tmp_path / "short.bin"
    np.fromfile(TOKENS, dtype=np.int32)[:2 * N_CTX - 1].tofile(short)
    p = perplexity(models["llama-tied"], tokens=short, check=False)
    assert p.returncode == 1 and "you need at least 128 tokens" in p.stderr and "only 127" in p.stderr

    outside = tmp_path / "outside.bin"
    np.array([1] + [5000] * 200, dtype=np.int32).tofile(outside)
    p = perplexity(models["llama-tied"], tokens=outside, check=False)
    assert p.returncode == 1 and "token id 5000 at index 1 is outside the vocabulary (0..383)" in p.stderr

    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x00")
    p = perplexity(models["llama-tied"], tokens=odd, check=False)
    assert p.returncode == 1 and "3 bytes is not a whole number" in p.stderr

    p = perplexity(models["llama-tied"], "-ctk", "q8_0", check=False)
    assert p.returncode == 2 and "f16, bf16 or f32" in p.stderr


def rewritten(src, dst, drop_prefix=None, arch=None):
    """A copy of a GGUF with keys dropped or the architecture renamed, through the gguf package."""
    import gguf
    r = gguf.GGUFReader(str(src))
    old = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch or old)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or (drop_prefix and name.startswith(drop_prefix)):
            continue
        key = name.replace(old + ".", (arch or old) + ".", 1)
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), vtype)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_refuses_an_architecture_it_lacks_and_a_model_without_vocabulary(models, tmp_path):
    other = rewritten(models["llama-tied"], tmp_path / "phi2.gguf", arch="phi2")
    p = perplexity(other, check=False)
    assert p.returncode == 1 and "does not run architecture 'phi2'" in p.stderr and "llama qwen2 qwen3" in p.stderr
    bare = rewritten(models["llama-tied"], tmp_path / "bare.gguf", drop_prefix="tokenizer.")
    p = perplexity(bare, check=False)
    assert p.returncode == 1 and "no vocabulary" in p.stderr


def copied(src, dst, extra_f32=None, drop_tensor=None):
    """A copy of a GGUF with an f32 key added or a tensor left out, through the gguf package."""
    import gguf
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, field.contents())
        else:
            w.add_key_value(name, field.contents(), field.types[0])
    for key, value in (extra_f32 or {}).items():
        w.add_float32(key, value)
    for t in r.tensors:
        if t.name != drop_tensor:
            w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_refuses_what_the_dense_architectures_lack_or_do_not_run_yet(models, tmp_path):
    """Mistral 3's attention temperature tuning (Llama 4's) is refused by name, not run wrong; a
    Phi-3 block with neither its fused q/k/v nor the three apart is named."""
    temp = copied(models["mistral3"], tmp_path / "temp.gguf", extra_f32={"mistral3.attention.temperature_scale": 0.1})
    p = perplexity(temp, check=False)
    assert p.returncode == 1 and "attention.temperature_scale = 0.1" in p.stderr, p.stderr
    no_qkv = copied(models["phi3"], tmp_path / "no_qkv.gguf", drop_tensor="blk.1.attn_qkv.weight")
    p = perplexity(no_qkv, check=False)
    assert p.returncode == 1 and "neither blk.1.attn_qkv.weight nor blk.1's attn_q, attn_k and attn_v" in p.stderr


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q5_1"])
def test_quantized_model_runs_as_its_f32_dequantization(models, tmp_path, fmt):
    """Each block is dequantized to f32 before it runs: a quantized file gives the logits of
    its own F32 dequantization (quantd convert --recipe F32 --allow-requantize), bit for bit."""
    q, f = tmp_path / "q.gguf", tmp_path / "f32.gguf"
    for args in (["--in", models["llama-gqa"], "--out", q, "--fmt", fmt],
                 ["--in", q, "--out", f, "--recipe", "F32", "--allow-requantize"]):
        p = subprocess.run([QUANTD, "convert", *map(str, args)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    sa = summary(perplexity(q, "--chunks", "4", "--dump-logits", a))
    sb = summary(perplexity(f, "--chunks", "4", "--dump-logits", b))
    assert a.read_bytes() == b.read_bytes() and sa["ln_ppl"] == sb["ln_ppl"]
    # and the quantization is there: the logits moved from the F32 model's
    c = tmp_path / "c.bin"
    perplexity(models["llama-gqa"], "--chunks", "4", "--dump-logits", c)
    assert a.read_bytes() != c.read_bytes()
