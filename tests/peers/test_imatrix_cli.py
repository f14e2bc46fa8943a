"""quantd imatrix against llama-imatrix's recorded files (tests/fixtures/imatrix/, made by
tests/fixtures/make_imatrix_model_fixtures.py; the live comparison is
tests/consumers/test_llama_cpp_imatrix.py), on tiny F32 models (tests/model/tiny_model.py):
- each file's layout as llama-imatrix writes it: the same keys and values (datasets, chunk count,
  chunk size), the same tensors in the same order and shapes (GGUF), the same entries, calls and
  trailer (.dat); the counts equal and every value within a relative 1e-4;
- the mixtures of experts (qwen3moe, deepseek2; 8 experts): the 3-D *_exps tensors' per-expert
  counts equal (uneven, adding up to tokens x experts used) and their per-expert sums within 1e-4;
- the perplexity printed alongside within a relative 1e-4;
- --in-file combining of GGUF and .dat files byte for byte as llama-imatrix combines them;
- IQ2_XXS quantized by quantd convert from quantd's matrix and from llama-imatrix's: at least
  99 % of the blocks identical (a matrix of another part of the text gives far fewer);
- the refusals: no tokens and no files, a damaged --in-file, an unwritable output (nothing left
  behind)."""
import json
import os
import re
import struct
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "imatrix")
TEXT_DIR = os.path.join(ROOT, "tests", "fixtures", "model")
TOKENS = os.path.join(TEXT_DIR, "tokens.bin")
TINY = os.path.join(ROOT, "tests", "model", "tiny_model.py")
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))

with open(os.path.join(FIXTURES, "imatrix.json")) as f:
    RECORD = json.load(f)
RUNS = {r["file"]: r for r in RECORD["runs"]}
COMPUTED = [r["file"] for r in RECORD["runs"] if "--in-file" not in r["args"]]


def quantd(*args, check=True, cwd=None):
    p = subprocess.run([QUANTD, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    out = {}
    for name, args in RECORD["models"].items():
        out[name] = d / (name + ".gguf")
        subprocess.run([sys.executable, TINY, str(out[name]), *args], check=True)
    return out


def imatrix_like_the_fixture(models, file, out):
    """quantd imatrix with the recorded run's arguments, the text's ids given with --tokens."""
    run = RUNS[file]
    return quantd("imatrix", "-m", models[run["model"]], "--tokens", TOKENS, "-t", "2", "-o", out, *run["args"],
                  cwd=TEXT_DIR)


def read_gguf(path):
    r = gguf.GGUFReader(str(path))
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    return kv, [(t.name, list(t.shape), np.array(t.data, dtype=np.float64)) for t in r.tensors]


def read_dat(path):
    b = open(path, "rb").read()
    n, = struct.unpack_from("<i", b, 0)
    at, entries = 4, []
    for _ in range(n):
        k, = struct.unpack_from("<i", b, at)
        name = b[at + 4:at + 4 + k].decode()
        at += 4 + k
        ncall, nval = struct.unpack_from("<ii", b, at)
        values = np.frombuffer(b, dtype="<f4", count=nval, offset=at + 8).astype(np.float64)
        at += 8 + 4 * nval
        entries.append((name, ncall, values))
    chunks, k = struct.unpack_from("<ii", b, at)
    dataset = b[at + 8:at + 8 + k].decode()
    assert at + 8 + k == len(b)
    return entries, chunks, dataset


def close(ours, ref, rel=1e-4):
    """Every value within rel of llama-imatrix's (zeros exactly zero); the worst relative error."""
    diff = np.abs(ours - ref)
    assert (diff <= rel * np.abs(ref)).all(), float((diff / np.maximum(np.abs(ref), 1e-30)).max())
    return float((diff / np.where(ref == 0, 1, np.abs(ref))).max())


def final_ppl(text):
    return float(re.search(r"Final estimate: PPL = ([0-9.]+)", text).group(1))


@pytest.mark.parametrize("file", COMPUTED)
def test_imatrix_equals_llama_imatrix(models, tmp_path, file):
    out = tmp_path / file
    p = imatrix_like_the_fixture(models, file, out)
    ref = os.path.join(FIXTURES, file)
    worst = 0.0
    if file.endswith(".gguf"):
        kv, tensors = read_gguf(out)
        kv_ref, tensors_ref = read_gguf(ref)
        assert kv == kv_ref
        assert [(n, s) for n, s, _ in tensors] == [(n, s) for n, s, _ in tensors_ref]
        for (name, _, ours), (_, _, want) in zip(tensors, tensors_ref):
            if name.endswith(".counts"):
                assert (ours == want).all(), name
            else:
                worst = max(worst, close(ours, want))
        if "--process-output" in RUNS[file]["args"]:
            assert "output.weight.in_sum2" in [n for n, _, _ in tensors]
    else:
        entries, chunks, dataset = read_dat(out)
        entries_ref, chunks_ref, dataset_ref = read_dat(ref)
        assert (chunks, dataset) == (chunks_ref, dataset_ref)
        assert [(n, c) for n, c, _ in entries] == [(n, c) for n, c, _ in entries_ref]
        for (_, _, ours), (_, _, want) in zip(entries, entries_ref):
            worst = max(worst, close(ours, want))
    print(f"{file}: worst relative error {worst:.2e}")
    ppl, ppl_ref = final_ppl(p.stdout), final_ppl(RUNS[file]["final"])
    assert abs(ppl - ppl_ref) / ppl_ref < 1e-4


@pytest.mark.parametrize("file", ["combined.gguf", "combined.dat"])
def test_in_file_combines_as_llama_imatrix(tmp_path, file):
    ins = [os.path.join(FIXTURES, f) for f in ("llama-untied.gguf", "llama-untied-from8.gguf", "llama-untied.dat")]
    fmt = ["--output-format", "dat"] if file.endswith(".dat") else []
    quantd("imatrix", "--in-file", ",".join(ins), "-c", 64, "-o", tmp_path / "a", *fmt)
    # repeated --in-file flags add up the same
    quantd("imatrix", "--in-file", ins[0], "--in-file", ins[1], "--in-file", ins[2], "-c", 64, "-o", tmp_path / "b", *fmt)
    want = open(os.path.join(FIXTURES, file), "rb").read()
    assert open(tmp_path / "a", "rb").read() == want
    assert open(tmp_path / "b", "rb").read() == want


def test_in_file_then_compute_adds_the_new_chunks(models, tmp_path):
    """An earlier file added before computing: the sums and counts of both runs."""
    out = tmp_path / "more.gguf"
    quantd("imatrix", "-m", models["llama-untied"], "--tokens", TOKENS, "-c", 64, "--chunk", 8, "--chunks", 4,
           "--in-file", os.path.join(FIXTURES, "llama-untied.gguf"), "--no-ppl", "-o", out)
    kv, tensors = read_gguf(out)
    _, first = read_gguf(os.path.join(FIXTURES, "llama-untied.gguf"))
    _, second = read_gguf(os.path.join(FIXTURES, "llama-untied-from8.gguf"))
    assert kv["imatrix.chunk_count"] == 12
    second = {n: v for n, _, v in second}
    for (name, _, ours), (_, _, a) in zip(tensors, first):
        b = second.get(name, np.zeros_like(a))  # output.weight: only in the first
        if name.endswith(".counts"):
            assert (ours == a + b).all()
        else:
            close(ours, a + b)


def blocks(path, block_bytes=66):
    """The IQ2_XXS tensors' blocks (66 bytes per 256 values) by tensor name."""
    r = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(t.data).reshape(-1, block_bytes) for t in r.tensors
            if t.tensor_type == gguf.GGMLQuantizationType.IQ2_XXS}


def identical_share(a, b):
    same = sum(int((a[n] == b[n]).all(axis=1).sum()) for n in a)
    return same / sum(len(a[n]) for n in a)


def test_iq2_xxs_from_quantd_imatrix_matches_llama_imatrix(models, tmp_path):
    model = models["llama-wide"]
    ours = tmp_path / "ours.gguf"
    imatrix_like_the_fixture(models, "llama-wide.gguf", ours)
    other = tmp_path / "other.gguf"  # another part of the text: the control
    quantd("imatrix", "-m", model, "--tokens", TOKENS, "-c", 64, "--chunk", 16, "--chunks", 8, "--no-ppl", "-o", other)
    outs = {}
    for name, im in (("ours", ours), ("ref", os.path.join(FIXTURES, "llama-wide.gguf")), ("other", other)):
        outs[name] = tmp_path / (name + "-iq2.gguf")
        quantd("convert", "--in", model, "--out", outs[name], "--recipe", "IQ2_XXS", "--imatrix", im)
    ours_b, ref_b, other_b = blocks(outs["ours"]), blocks(outs["ref"]), blocks(outs["other"])
    assert sorted(ours_b) == sorted(ref_b) and len(ref_b) >= 10  # the mix keeps a few weights in other types
    share, control = identical_share(ours_b, ref_b), identical_share(other_b, ref_b)
    print(f"IQ2_XXS blocks identical: {100 * share:.2f} % (another text's matrix: {100 * control:.2f} %)")
    assert share >= 0.99
    assert control < 0.9


def test_refusals_leave_nothing_behind(models, tmp_path):
    p = quantd("imatrix", "-o", tmp_path / "x.gguf", check=False)
    assert p.returncode == 2 and "--in-file" in p.stderr and "--tokens" in p.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(open(os.path.join(FIXTURES, "llama-untied.gguf"), "rb").read()[:300])
    p = quantd("imatrix", "--in-file", bad, "-o", tmp_path / "y.gguf", check=False)
    assert p.returncode == 1 and "bad.gguf" in p.stderr and "does not read" in p.stderr
    p = quantd("imatrix", "--in-file", os.path.join(FIXTURES, "llama-untied.gguf"), "--in-file",
               os.path.join(FIXTURES, "llama-wide.gguf"), "-o", tmp_path / "z.gguf", check=False)
    assert p.returncode == 1 and "another model" in p.stderr
    p = quantd("imatrix", "-m", models["llama-untied"], "--tokens", TOKENS, "-c", 64, "--chunks", 2,
               "-o", tmp_path / "no" / "w.gguf", check=False)
    assert p.returncode == 1 and "the folder" in p.stderr and "No such file" in p.stderr
    p = quantd("imatrix", "-m", models["llama-untied"], "--tokens", TOKENS, "-c", 1500, "-o", tmp_path / "v.gguf",
               check=False)
    assert p.returncode == 1 and "at least 3000 tokens" in p.stderr
    p = quantd("imatrix", "-m", models["llama-untied"], "-f", tmp_path / "no-such-text.txt", check=False)
    assert p.returncode == 1 and "no-such-text.txt" in p.stderr and "No such file" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.gguf"]


def has_cuda_device():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def test_convert_calibrate_is_imatrix_then_convert(models, tmp_path):
    """quantd convert --calibrate-tokens: the matrix quantd imatrix makes, then the conversion with
    it, in one run: the same file byte for byte as the two steps, its quantize.imatrix.* keys
    naming the text (--calibrate) as llama-quantize names an imatrix file; no temporary left."""
    model = models["llama-wide"]
    quantd("imatrix", "-m", model, "--tokens", TOKENS, "-f", "text.txt", "-c", 64, "--chunks", 8, "--no-ppl",
           "-o", tmp_path / "text.txt")
    quantd("convert", "--in", model, "--out", "two.gguf", "--recipe", "IQ2_XXS", "--imatrix", "text.txt", cwd=tmp_path)
    env_tmp = tmp_path / "tmpdir"
    env_tmp.mkdir()
    p = subprocess.run([QUANTD, "convert", "--in", str(model), "--out", "one.gguf", "--recipe", "IQ2_XXS",
                        "--calibrate", "text.txt", "--calibrate-tokens", TOKENS, "--calibrate-ctx", "64",
                        "--calibrate-chunks", "8"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(env_tmp)})
    assert p.returncode == 0, p.stderr
    assert open(tmp_path / "one.gguf", "rb").read() == open(tmp_path / "two.gguf", "rb").read()
    kv = {f.name: f.contents() for f in gguf.GGUFReader(str(tmp_path / "one.gguf")).fields.values()
          if f.name.startswith("quantize.imatrix")}
    assert kv == {"quantize.imatrix.file": "text.txt", "quantize.imatrix.dataset": "text.txt",
                  "quantize.imatrix.entries_count": 14, "quantize.imatrix.chunks_count": 8}
    assert os.listdir(env_tmp) == []
    # the text alone, tokenized by quantd (llama-tokenize's ids, tests/peers/test_tokenize.py):
    # the same file again
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copy(os.path.join(TEXT_DIR, "text.txt"), sub / "text.txt")
    quantd("convert", "--in", model, "--out", "three.gguf", "--recipe", "IQ2_XXS", "--calibrate", "text.txt",
           "--calibrate-ctx", "64", "--calibrate-chunks", "8", "--backend", "cpu", cwd=sub)
    assert open(sub / "three.gguf", "rb").read() == open(tmp_path / "two.gguf", "rb").read()
    # refusals: both sources, a context under 16, a cap that is no byte count; and the engine on a
    # device this machine lacks (CI has no GPU): nothing written
    for args, says, rc in ((["--calibrate-tokens", TOKENS, "--imatrix", "text.txt"], "not both", 2),
                           (["--calibrate-tokens", TOKENS, "--calibrate-ctx", "8"], ">= 16", 2),
                           (["--calibrate-tokens", TOKENS, "--max-device-bytes", "4 apples"], "byte count", 2),
                           (["--calibrate-tokens", TOKENS, "--backend", "cuda"], "--backend cuda", 1)):
        if rc == 1 and has_cuda_device():
            continue
        p = quantd("convert", "--in", model, "--out", "x.gguf", "--recipe", "IQ2_XXS", *args, check=False, cwd=tmp_path)
        assert p.returncode == rc and says in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "x.gguf")


def test_text_runs_as_its_token_ids(models, tmp_path):
    """-f TEXT alone: quantd's tokenizer gives llama-tokenize's ids (tests/fixtures/model/tokens.bin
    was made by it from this text), so the matrix is the one --tokens gives, byte for byte (both
    name the text as their dataset)."""
    text = os.path.join(TEXT_DIR, "text.txt")
    common = ("-m", models["llama-untied"], "-c", 64, "--chunks", 4, "--no-ppl", "-f", text)
    quantd("imatrix", *common, "-o", tmp_path / "text.gguf")
    quantd("imatrix", *common, "--tokens", TOKENS, "-o", tmp_path / "ids.gguf")
    assert open(tmp_path / "text.gguf", "rb").read() == open(tmp_path / "ids.gguf", "rb").read()


MOE = [f for f in COMPUTED if RECORD["models"][RUNS[f]["model"]].count("--experts")]


def test_moe_fixtures_hold_per_expert_counts(models, tmp_path):
    """The mixtures of experts' files (8 experts, 2 a token): each 3-D *_exps tensor has one
    count per expert, uneven (the routing's), adding up to tokens x experts used, and quantd's
    equal; the .dat files' calls for them as llama-imatrix derives them from those counts."""
    assert sorted(MOE) == ["deepseek2.dat", "deepseek2.gguf", "qwen3moe.dat", "qwen3moe.gguf"]
    for file in MOE:
        run = RUNS[file]
        args = RECORD["models"][run["model"]]
        n_expert, n_used = (int(args[args.index(k) + 1]) for k in ("--experts", "--experts-used"))
        n_tokens = int(run["args"][run["args"].index("-c") + 1]) * int(run["args"][run["args"].index("--chunks") + 1])
        out = tmp_path / file
        imatrix_like_the_fixture(models, file, out)
        if file.endswith(".dat"):
            ours = {n: c for n, c, _ in read_dat(out)[0] if "_exps" in n}
            ref = {n: c for n, c, _ in read_dat(os.path.join(FIXTURES, file))[0] if "_exps" in n}
            assert len(ref) >= 6 and ours == ref
            continue
        _, tensors = read_gguf(out)
        _, tensors_ref = read_gguf(os.path.join(FIXTURES, file))
        counts = {n: (s, v) for n, s, v in tensors if "_exps" in n and n.endswith(".counts")}
        counts_ref = {n: (s, v) for n, s, v in tensors_ref if "_exps" in n and n.endswith(".counts")}
        assert len(counts_ref) >= 6 and sorted(counts) == sorted(counts_ref)
        for name, (shape, want) in counts_ref.items():
            assert shape == [1, n_expert] and want.sum() == n_tokens * n_used and want.min() < want.max(), name
            assert counts[name][0] == shape and (counts[name][1] == want).all(), name
