"""`quantd llama-quantize`, llama-quantize's own command line: every case of
tests/fixtures/gguf_options (llama-quantize's files, made by llama-quantize itself) given as
llama-quantize was given it writes the same file; OUT left out, TYPE by number, nthreads, and
the refusals. And what an importance matrix covered: the summary says it, the command line
warns where it left tensors out, `quantd convert` and jobs refuse one that covers none of the
tensors quantized (before anything is written), `quantd llama-quantize` warns a line per tensor
as llama-quantize does and records no importance matrix in the output."""
import json
import os
import struct
import subprocess

import gguf
import pytest

from conftest import QUANTD, run_quantd
from test_gguf_options import FIX, http, models, options, run_job, service, sha256  # noqa: F401 (fixtures)


def lq(*args, cwd=None):
    return subprocess.run([QUANTD, "llama-quantize", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("key", sorted(FIX["cases"]))
def test_llama_quantize_writes_llama_quantizes_file(models, tmp_path, key):
    """OPTIONS IN OUT TYPE nthreads, as the fixture ran llama-quantize (in the models' directory:
    an imatrix is named relative to it, as the file records it)."""
    case = FIX["cases"][key]
    out = tmp_path / "out.gguf"
    p = lq(*options(models, case), models[case["model"]], out, case["mix"], 2, cwd=models["DIR"])
    assert p.returncode == 0, p.stderr
    assert sha256(out) == case["sha256"], key
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    assert summary["out"] == str(out) and summary["bytes_out"] == case["bytes"]


def test_out_left_out_is_ggml_model_type_beside_the_input(models, tmp_path):
    """IN TYPE: ggml-model-TYPE.gguf in IN's directory (the mix's name for a number); an existing
    one is replaced, as llama-quantize replaces it."""
    src = tmp_path / "in.gguf"
    src.write_bytes(models["llama"].read_bytes())
    case = FIX["cases"]["leave_output"]
    out = tmp_path / "ggml-model-Q4_K_M.gguf"
    out.write_bytes(b"an older one")
    p = lq("--leave-output-tensor", src, "15")
    assert p.returncode == 0, p.stderr
    assert sha256(out) == case["sha256"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ggml-model-Q4_K_M.gguf", "in.gguf"]
    p = lq("--dry-run", src, "q8_0")  # nothing written, no OUT needed
    assert p.returncode == 0 and json.loads(p.stdout.splitlines()[-1])["summary"]["dry_run"] is True
    assert not (tmp_path / "ggml-model-Q8_0.gguf").exists()


@pytest.mark.parametrize("args,says", [
    (["IN"], "give IN [OUT] TYPE [nthreads]"),
    (["IN", "OUT"], "TYPE is missing after"),
    (["IN", "OUT", "Q9_K"], "unknown recipe 'Q9_K'"),
    (["IN", "OUT", "Q4_0", "four"], "nthreads 'four' is not a number of threads"),
    (["IN", "OUT", "Q4_0", "4", "more"], "unexpected argument 'more' after nthreads"),
    (["--target-bpw", "4.5", "IN", "OUT", "Q4_0"], "--target-bpw is an option of newer llama-quantize builds"),
    (["--colour", "IN", "OUT", "Q4_0"], "unknown option '--colour'"),
    (["--tensor_type", "attn_v=q8_0", "IN", "OUT", "Q4_0"], "unknown option '--tensor_type'"),
    (["--tensor-type", "attn_v", "IN", "OUT", "Q4_0"], "--tensor-type: 'attn_v' has no '='"),
    (["IN", "IN", "Q4_0"], "is the input"),
])
def test_llama_quantize_refusals(models, tmp_path, args, says):
    args = [models["llama"] if a == "IN" else tmp_path / "out.gguf" if a == "OUT" else a for a in args]
    p = lq(*args)
    assert p.returncode in (1, 2) and says in p.stderr and p.stderr.startswith("quantd llama-quantize: "), p.stderr
    assert not (tmp_path / "out.gguf").exists()


def test_nthreads_and_help(models, tmp_path):
    """nthreads is the CPU's thread count: the file is the same whatever it is (0: every core)."""
    outs = []
    for n in ("1", "3", "0"):
        out = tmp_path / f"t{n}.gguf"
        p = lq(models["llama"], out, "Q4_K_M", n)
        assert p.returncode == 0, p.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    assert "model-f32.gguf [model-quant.gguf] type [nthreads]" in lq("--help").stdout
    assert "llama-quantize [options] IN [OUT] TYPE [nthreads]" in run_quantd("--help").stdout


def test_convert_points_a_positional_argument_at_llama_quantize(models, tmp_path):
    """llama-quantize's habit of a trailing thread count (or any positional form) in quantd
    convert says where that form is taken."""
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "Q4_K_M", "2",
                   check=False)
    assert p.returncode == 2 and "unexpected argument '2'" in p.stderr and "quantd llama-quantize" in p.stderr
    p = run_quantd("convert", models["llama"], tmp_path / "o.gguf", "Q4_K_M", check=False)
    assert p.returncode == 2 and "quantd llama-quantize [options] IN OUT TYPE [nthreads]" in p.stderr
    assert not (tmp_path / "o.gguf").exists()


# ---- what an importance matrix covered ------------------------------------------------------

def quantized_names(path):
    """The tensors of a GGUF that are of a block type (quantized)."""
    floats = {"F32", "F16", "BF16"}
    return [t.name for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type.name not in floats]


def imatrix_keys(path):
    return sorted(k for k in gguf.GGUFReader(str(path)).fields if k.startswith("quantize.imatrix"))


def write_dat(path, names, n=64):
    """A legacy .dat importance matrix with an entry of n ones for each name."""
    b = struct.pack("<i", len(names))
    for name in names:
        b += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, n) + struct.pack(f"<{n}f", *[1.0] * n)
    path.write_bytes(b)


def test_summary_says_what_the_imatrix_covered(models, tmp_path):
    """An imatrix with an entry for every tensor quantized: the summary says so and the command
    line says nothing more; one whose entries --exclude-weights narrowed: the summary's count is
    the tensors left with an entry, and a warning line names the count and the first without
    one (the file is llama-quantize's all the same)."""
    case = FIX["cases"]["imatrix_dat_q4_k_m"]
    out = tmp_path / "all.gguf"
    p = subprocess.run([QUANTD, "convert", "--in", models["llama"], "--out", out, *options(models, case),
                        "--recipe", case["mix"]], capture_output=True, text=True, cwd=models["DIR"])
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout.splitlines()[-1])["summary"]
    assert sha256(out) == case["sha256"]
    assert s["imatrix"] == "llama.imatrix.dat" and s["imatrix_covered"] == s["quantized"] == len(quantized_names(out))
    assert s["imatrix_entries"] >= s["imatrix_covered"] and "warning" not in p.stderr
    case = FIX["cases"]["imatrix_exclude"]
    out = tmp_path / "some.gguf"
    p = subprocess.run([QUANTD, "convert", "--in", models[case["model"]], "--out", out, *options(models, case),
                        "--recipe", case["mix"]], capture_output=True, text=True, cwd=models["DIR"])
    assert p.returncode == 0, p.stderr
    assert sha256(out) == case["sha256"]
    s = json.loads(p.stdout.splitlines()[-1])["summary"]
    left_out = [n for n in quantized_names(out) if "ffn_down" in n or "attn_q" in n]
    assert left_out and s["imatrix_covered"] == s["quantized"] - len(left_out), (s, left_out)
    warning = [line for line in p.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and f"covered {s['imatrix_covered']} of the {s['quantized']} quantized" in warning[0]
    assert "no entry for blk.0.attn_q.weight" in warning[0], warning


def test_an_imatrix_of_another_model_is_refused_by_convert(models, tmp_path):
    """Entries under names the model does not have (a Hugging Face model's, here): quantd convert
    refuses it before writing anything, naming the file and why; filters that leave no entry
    are refused too."""
    other = tmp_path / "other.dat"
    write_dat(other, ["model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"])
    out = tmp_path / "o.gguf"
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--recipe", "Q4_K_M", "--imatrix", other,
                   check=False)
    assert p.returncode == 1, p.stderr
    assert f"the importance matrix {other} covers none of the" in p.stderr and "made for another model" in p.stderr
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--recipe", "Q4_K_M", "--imatrix",
                   models["DIR"] / "llama.imatrix.dat", "--include-weights", "nothing.like.this", check=False)
    assert p.returncode == 1 and "no entry left after --include-weights / --exclude-weights" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["other.dat"]


def test_an_imatrix_of_another_model_fails_the_job(service, tmp_path):
    base, data = service
    write_dat(data / "other.dat", ["model.layers.0.mlp.up_proj.weight"])
    status, r = run_job(base, {"source": "llama.gguf", "destination": "other-im.gguf", "recipe": "Q4_K_M",
                               "imatrix": "other.dat"})
    assert status == 400 and r["error"]["code"] == "bad_request", r
    assert "the importance matrix other.dat covers none of the" in r["error"]["message"], r
    assert str(data) not in r["error"]["message"]
    assert not (data / "other-im.gguf").exists()
    status, r = run_job(base, {"source": "llama.gguf", "destination": "own-im.gguf", "recipe": "Q4_K_M",
                               "imatrix": "llama.imatrix.gguf", "overwrite": True})
    assert status == 200 and r["imatrix"] == "llama.imatrix.gguf" and r["imatrix_covered"] == r["quantized"], r


def test_llama_quantize_warns_per_tensor_and_records_no_imatrix(models, tmp_path):
    """As llama-quantize, quantd llama-quantize goes on without the entries it lacks, a line per
    tensor ("did not find weights for NAME"); where it covered none of them, the output records
    no importance matrix (llama-quantize's would name the file) and is the file written without
    one."""
    other = tmp_path / "other.dat"
    write_dat(other, ["model.layers.0.mlp.up_proj.weight"])
    out, plain = tmp_path / "o.gguf", tmp_path / "plain.gguf"
    p = lq("--imatrix", other, models["llama"], out, "Q4_K_M")
    assert p.returncode == 0, p.stderr
    names = quantized_names(out)
    missing = [line.split("did not find weights for ")[1].split(":")[0] for line in p.stderr.splitlines()
               if "did not find weights for " in line]
    assert sorted(missing) == sorted(names), (missing, names)
    assert f"covered none of the {len(names)} quantized tensors" in p.stderr and "records none" in p.stderr
    assert imatrix_keys(out) == []
    s = json.loads(p.stdout.splitlines()[-1])["summary"]
    assert s["imatrix_covered"] == 0 and s["imatrix_entries"] == 1
    run_quantd("llama-quantize", models["llama"], plain, "Q4_K_M")
    assert out.read_bytes() == plain.read_bytes()
    # one that covers some: their lines, and the keys llama-quantize records
    p = lq("--imatrix", models["DIR"] / "llama.imatrix.dat", "--exclude-weights", "attn_k", models["llama"], out,
           "Q4_K_M")
    assert p.returncode == 0, p.stderr
    missing = sorted(line.split("did not find weights for ")[1].split(":")[0] for line in p.stderr.splitlines()
                     if "did not find weights for " in line)
    assert missing == sorted(n for n in quantized_names(out) if "attn_k" in n) and missing
    assert imatrix_keys(out) == ["quantize.imatrix.chunks_count", "quantize.imatrix.dataset",
                                 "quantize.imatrix.entries_count", "quantize.imatrix.file"]
