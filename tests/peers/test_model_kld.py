"""quantd perplexity --kl-divergence against llama-perplexity's recorded figures
(tests/fixtures/model/kld/, made by tests/fixtures/make_kld_fixtures.py; the live comparison,
both ways, is tests/consumers/test_llama_cpp_kld.py). The tiny llama-gqa model
(tests/model/cases.py), quantized by quantd convert --fmt q4_0 / q8_0, against its F32 base:
- quantd reads llama-perplexity's base file (base.kld) and every statistic it reports (PPL of
  both and their ratio and difference, the KL divergence's mean, percentiles, Δp, same top p)
  is within 1 % of llama-perplexity's on the quantized file's F32 dequantization (or within the
  resolution llama-perplexity prints it with, for figures near zero);
- the base file quantd writes for the F32 model has llama-perplexity's header and tokens byte
  for byte, its log-probabilities within one code of llama-perplexity's, and gives the same
  statistics;
- the refusals: a base file of another vocabulary, other tokens, a smaller -c, a truncated,
  overlong, foreign or damaged file; and a failed run leaves an existing output as it was."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from cases import FIXTURES, N_CTX, TINY, make_model  # noqa: E402
import kld_report  # noqa: E402

QUANTD = os.environ.get("QUANTD", os.path.join(HERE, "..", "..", "bin", "quantd"))
KLD = os.path.join(FIXTURES, "kld")
BASE = os.path.join(KLD, "base.kld")
TOKENS = os.path.join(FIXTURES, "tokens.bin")
F32_PATH = ["-ctk", "f32", "-ctv", "f32"]  # llama-perplexity's -ctk f32 -ctv f32 -fa off

# the resolution llama-perplexity prints each figure with (half its last digit), as a fraction
RESOLUTION = {"ppl": 5e-7, "kld": 5e-7, "delta_p": 5e-6, "same_top_p": 5e-6, "same_top_p_error": 5e-6,
              "correlation": 5e-5}


def recorded():
    with open(os.path.join(KLD, "kld.json")) as f:
        return json.load(f)


def run(*args, check=True):
    p = subprocess.run([QUANTD, "perplexity", *map(str, args)], capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def summary(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


def figures(d, prefix=""):
    """{"kld.mean": x, ...} from a nested summary (the chunk lines left out)"""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(figures(v, prefix + k + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = float(v)
    return out


def compare(ours, ref, label, roundings=1, kld_floor=0.0):
    """every figure of ref within 1 % (or the printed resolution, once per rounded side) of ours;
    the worst relative difference beyond what the rounding to printed digits explains is printed,
    and every figure out of bounds before the assertion fails. kld_floor: an absolute tolerance
    (nats) for the KL divergence's per-position figures, for those at the base file's own
    resolution (its codes are up to 16/65535 nats apart: a model against its own base shows
    divergences of 1e-5), printed when used"""
    worst, worst_key, bad = 0.0, None, []
    flat = figures(ours)
    for key, want in figures({k: v for k, v in ref.items() if k != "chunks"}).items():
        got = flat[key]
        res = RESOLUTION.get(key.split(".")[-1], RESOLUTION.get(key.split(".")[0], 5e-7))
        bound = 0.01 * abs(want) + roundings * res
        if abs(got - want) > bound + (kld_floor if key.startswith("kld.") else 0.0):
            bad.append(f"{key} {got:.6g} against llama-perplexity's {want:.6g}")
        elif abs(got - want) > bound:
            print(f"{label}: {key} {got:.6g} against llama-perplexity's {want:.6g}: within {kld_floor:g} nats")
        if want:
            rel = max(0.0, abs(got - want) - roundings * res) / abs(want)
            worst, worst_key = max((worst, worst_key or key), (rel, key))
    print(f"{label}: worst relative difference {worst:.2e} ({worst_key})")
    assert not bad, f"{label}: " + "; ".join(bad)
    return worst


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kld")
    rec = recorded()
    f32 = d / "f32.gguf"
    subprocess.run([sys.executable, TINY, str(f32), *rec["args"]], check=True)
    out = {"f32": f32}
    for fmt in ("q4_0", "q8_0"):
        out[fmt] = d / (fmt + ".gguf")
        subprocess.run([QUANTD, "convert", "--in", f32, "--out", out[fmt], "--fmt", fmt], check=True,
                       capture_output=True)
    return out


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_kld_of_quantized_file_equals_llama_perplexity_on_its_dequantization(models, fmt):
    ref = recorded()[fmt]["dequant"]
    p = run("-m", models[fmt], "--kl-divergence-base", BASE, "--kl-divergence", *F32_PATH, "-t", "2")
    s = summary(p)
    assert s["chunks"] == 4 and s["tokens_scored"] == 4 * (N_CTX - 1 - N_CTX // 2) and s["n_ctx"] == N_CTX
    compare(s, ref, fmt)
    # the printed report parses back to the same figures, and the running lines are llama-perplexity's
    printed = kld_report.parse(p.stdout)
    compare(printed, ref, fmt + " (printed)", roundings=2)
    assert len(printed["chunks"]) == len(ref["chunks"]) == 4
    assert "====== KL divergence statistics ======" in p.stdout and "Same top p:" in p.stdout
    # the quantization is measured: the file's own (8-bit activations) figure differs from the dequantization's
    assert s["kld"]["mean"] > 1e-5


def test_base_file_written_as_llama_perplexity_writes_it(models, tmp_path):
    out = tmp_path / "base.kld"
    out.write_bytes(b"an older file, replaced when the new one is whole")
    s = summary(run("-m", models["f32"], "--tokens", TOKENS, "-c", N_CTX, "--chunks", 4, *F32_PATH, "-t", "2",
                    "--kl-divergence-base", out))
    assert s["kl_divergence_base"] == str(out)
    ours, ref = out.read_bytes(), open(BASE, "rb").read()
    assert len(ours) == len(ref)
    head = 20 + 4 * 4 * N_CTX
    assert ours[:head] == ref[:head]  # magic, n_ctx, n_vocab, n_chunk, the text's tokens

    def rows(b):
        r = np.frombuffer(b[head:], np.uint16).reshape(-1, 2 * ((384 + 1) // 2) + 4)
        sc = r[:, :4].copy().view(np.float32)
        return r, r[:, 4:4 + 384] * sc[:, :1].astype(np.float64) + sc[:, 1:2]

    (ra, la), (rb, lb) = rows(ours), rows(ref)
    share = float((ra == rb).mean())
    print(f"base file: {share:.4f} of its words equal llama-perplexity's, log-probabilities within "
          f"{np.abs(la - lb).max():.2e}")
    assert np.abs(la - lb).max() < 3e-4 and share > 0.95  # one code: 16 nats / 65535
    assert not glob.glob(str(out) + ".tmp-*")
    # and it measures what llama-perplexity's base measures
    compare(summary(run("-m", models["q4_0"], "--kl-divergence-base", out, "--kl-divergence", *F32_PATH)),
            recorded()["q4_0"]["dequant"], "q4_0 against quantd's base")
    # the base model against its own base: nothing lost but the 16-bit codes
    s = summary(run("-m", models["f32"], "--kl-divergence-base", BASE, "--kl-divergence", *F32_PATH))
    assert abs(s["kld"]["mean"]) < 1e-6 and s["same_top_p"] == 1.0


def refuse(*args, code=1):
    p = run(*args, check=False)
    assert p.returncode == code, (p.returncode, p.stderr)
    return p.stderr


def test_base_from_the_text_equals_the_base_from_its_ids(models, tmp_path):
    """-f TEXT: quantd's tokenizer makes llama-tokenize's ids of the text (tokens.bin), so the base
    file written from the text is the one written from the ids, byte for byte."""
    for name, src in (("text.kld", ["-f", os.path.join(FIXTURES, "text.txt")]), ("ids.kld", ["--tokens", TOKENS])):
        run("-m", models["f32"], *src, "-c", N_CTX, "--chunks", 2, *F32_PATH, "-t", "2",
            "--kl-divergence-base", tmp_path / name)
    assert (tmp_path / "text.kld").read_bytes() == (tmp_path / "ids.kld").read_bytes()


def test_refusals(models, tmp_path):
    ref = open(BASE, "rb").read()
    m = models["q4_0"]

    def base(name, data):
        (tmp_path / name).write_bytes(data)
        return tmp_path / name

    kld = ("--kl-divergence",)
    assert "needs --kl-divergence-base FILE" in refuse("-m", m, "--kl-divergence", code=2)
    assert "not taken with --kl-divergence" in refuse("-m", m, "--kl-divergence-base", BASE, *kld, "--dump-logits",
                                                      tmp_path / "x", code=2)
    # the base file may not replace an input
    assert "names the model" in refuse("-m", m, "--tokens", TOKENS, "-c", N_CTX, "--kl-divergence-base", m)
    assert "names the token file" in refuse("-m", m, "--tokens", TOKENS, "-c", N_CTX, "--kl-divergence-base", TOKENS)
    # --chunks N scores the base's first N chunks
    s = summary(run("-m", m, "--kl-divergence-base", BASE, *kld, "--chunks", 2))
    assert s["chunks"] == 2 and s["tokens_scored"] == 2 * (N_CTX - 1 - N_CTX // 2)
    # another vocabulary: a real model with 400 tokens against the 384-token base
    other = tmp_path / "v400.gguf"
    subprocess.run([sys.executable, TINY, str(other), *recorded()["args"], "--vocab", "400"], check=True)
    err = refuse("-m", other, "--kl-divergence-base", BASE, *kld)
    assert "inconsistent vocabulary" in err and "384 tokens" in err and "has 400" in err
    # other tokens
    ids = np.fromfile(TOKENS, dtype=np.int32)
    ids[100] = (ids[100] + 1) % 384
    ids.tofile(tmp_path / "other.bin")
    err = refuse("-m", m, "--kl-divergence-base", BASE, *kld, "--tokens", tmp_path / "other.bin")
    assert "another text" in err and "token 100" in err
    np.fromfile(TOKENS, dtype=np.int32)[:200].tofile(tmp_path / "short.bin")
    assert "end first" in refuse("-m", m, "--kl-divergence-base", BASE, *kld, "--tokens", tmp_path / "short.bin")
    assert run("-m", m, "--kl-divergence-base", BASE, *kld, "--tokens", TOKENS).returncode == 0  # the same text
    # a smaller context than the base's
    assert "give -c 64" in refuse("-m", m, "--kl-divergence-base", BASE, *kld, "-c", 32)
    # truncated, overlong, foreign, a damaged header, a damaged row
    assert "is truncated" in refuse("-m", m, "--kl-divergence-base", base("cut.kld", ref[:-10]), *kld)
    assert "is truncated" in refuse("-m", m, "--kl-divergence-base", base("cut2.kld", ref[:500]), *kld)
    assert "longer than its header says" in refuse("-m", m, "--kl-divergence-base", base("long.kld", ref + b"\0\0"),
                                                   *kld)
    assert "does not look like" in refuse("-m", m, "--kl-divergence-base", base("gguf.kld", open(m, "rb").read()),
                                          *kld)
    hdr = bytearray(ref)
    hdr[16:20] = np.int32(-3).tobytes()
    assert "n_chunk -3" in refuse("-m", m, "--kl-divergence-base", base("neg.kld", bytes(hdr)), *kld)
    tok = bytearray(ref)
    tok[20 + 4 * 70:24 + 4 * 70] = np.int32(384).tobytes()
    assert "token 70 is 384" in refuse("-m", m, "--kl-divergence-base", base("tok.kld", bytes(tok)), *kld)
    row = bytearray(ref)
    at = 20 + 4 * 4 * N_CTX + 3 * 2 * (2 * ((384 + 1) // 2) + 4) * 31 + 5 * 2 * 388  # chunk 4, row 5
    row[at:at + 4] = np.float32("nan").tobytes()
    p = run("-m", m, "--kl-divergence-base", base("nan.kld", bytes(row)), *kld, check=False)
    assert p.returncode == 1 and "chunk 4, row 5" in p.stderr and "damaged" in p.stderr
    assert "====== KL divergence statistics" not in p.stdout


def test_failed_run_leaves_existing_output_as_it_was(models, tmp_path):
    """A run that stops part way (here: NaN in the hidden states) removes its temporary and keeps the old file."""
    import gguf
    r = gguf.GGUFReader(str(models["f32"]))
    w = gguf.GGUFWriter(str(tmp_path / "nan.gguf"), r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, field.contents())
        else:
            w.add_key_value(name, field.contents(), vtype)
    for t in r.tensors:
        data = np.array(t.data)
        if t.name == "blk.1.ffn_down.weight":
            data = data.copy()
            data.flat[7] = np.nan
        w.add_tensor(t.name, data, raw_shape=list(reversed([int(x) for x in t.shape])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "base.kld"
    out.write_bytes(b"kept")
    err = refuse("-m", tmp_path / "nan.gguf", "--tokens", TOKENS, "-c", N_CTX, "--chunks", 2,
                 "--kl-divergence-base", out)
    assert "NaN" in err or "nan" in err.lower(), err
    assert out.read_bytes() == b"kept" and sorted(os.listdir(tmp_path)) == ["base.kld", "nan.gguf"]
