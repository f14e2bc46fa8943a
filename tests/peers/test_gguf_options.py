"""llama-quantize's options in quantd convert: for each case of tests/fixtures/gguf_options
(made by tests/fixtures/make_gguf_option_fixtures.py with llama-quantize itself), quantd writes
the same file, byte for byte, from the same input with the same options; --dry-run names the
types and the size of that file; numeric ids and any case name the mixes and types; bad
option values are refused with a message naming the option."""
import hashlib
import json
import os
import subprocess
import sys

import gguf
import pytest

from conftest import FIXTURES, ROOT, run_quantd

with open(os.path.join(FIXTURES, "gguf_options", "llama_quantize.json")) as f:
    FIX = json.load(f)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("opt")
    made = {}
    for name, (script, *args) in FIX["models"].items():
        made[name] = d / f"{name}.gguf"
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", script), str(made[name]), *args],
                       check=True)
        assert sha256(made[name]) == FIX["inputs"][name], \
            f"{name}: the gguf package writes another input than the fixtures were made from: remake them"
    types = d / "types.txt"
    types.write_text(FIX["types_file"])
    made["TYPES_FILE"] = types
    return made


def options(models, case):
    return [str(models["TYPES_FILE"]) if a == "TYPES_FILE" else a for a in case["options"]]


def types_of(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("key", sorted(FIX["cases"]))
def test_option_equals_llama_quantize(models, tmp_path, key):
    case = FIX["cases"][key]
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", models[case["model"]], "--out", out, *options(models, case), "--recipe", case["mix"])
    if sha256(out) != case["sha256"]:
        ours = types_of(out)
        differ = sorted(n for n in case["types"] if ours.get(n) != case["types"][n])
        raise AssertionError(f"{key}: the file differs from llama-quantize's ({os.path.getsize(out)} vs "
                             f"{case['bytes']} bytes); types that differ: " +
                             ", ".join(f"{n} {ours.get(n)} vs {case['types'][n]}" for n in differ[:6]))


def test_dry_run_names_types_and_size(models, tmp_path):
    """Each tensor's type and the size of the file llama-quantize writes, and no file."""
    for key in ("tensor_type", "prune_layers", "output_type_tied"):
        case = FIX["cases"][key]
        p = run_quantd("convert", "--in", models[case["model"]], "--dry-run", *options(models, case),
                       "--recipe", case["mix"])
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        summary = lines[-1]["summary"]
        assert summary["dry_run"] is True and summary["bytes_out"] == case["bytes"], (key, summary)
        types = {l["name"]: l["fmt"] for l in lines[:-1]}
        for name, t in case["types"].items():
            want = t.lower()
            if types[name] == "copied":  # a tensor left in its own type
                continue
            assert types[name].lower() == want, (key, name, types[name], t)
    out = tmp_path / "never.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", out, "--dry-run", "--recipe", "Q4_0")
    assert not out.exists()


@pytest.mark.parametrize("spelling", ["15", "q4_k_m", "Q4_k_M"])
def test_mix_by_number_or_any_case(models, tmp_path, spelling):
    """llama-quantize's numeric ids (15: Q4_K_M) and names in any case name the mix; the file is
    the one llama-quantize writes for Q4_K_M with --leave-output-tensor."""
    case = FIX["cases"]["leave_output"]
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", out, "--leave-output-tensor", "--recipe", spelling)
    assert sha256(out) == case["sha256"]


def test_fmt_number_is_pure_mix(models, tmp_path):
    """--fmt 11 is llama-quantize --pure 11 (Q3_K_S): its file type, every tensor q3_K."""
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", out, "--fmt", "11")
    assert sha256(out) == FIX["cases"]["pure_q3_k_s"]["sha256"]


def test_written_type_in_each_line(models, tmp_path):
    """The per-tensor line names the type written: Q4_K_M's output.weight is q6_K."""
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "Q4_K_M")
    lines = {l["name"]: l["fmt"] for l in map(json.loads, p.stdout.splitlines()[:-1])}
    assert lines["output.weight"] == "q6_K" and lines["blk.0.attn_q.weight"] == "q4_K"


@pytest.mark.parametrize("args,says", [
    (["--tensor-type", "attn_v"], "--tensor-type: 'attn_v' has no '='"),
    (["--tensor-type", "=q8_0"], "has no tensor name"),
    (["--tensor-type", "attn_v=q9_9"], "'q9_9' in 'attn_v=q9_9' is not a ggml type"),
    (["--tensor-type", "(?:attn)=q8_0"], "(?...) groups"),
    (["--tensor-type", "attn(=q8_0"], "--tensor-type 'attn('"),
    (["--output-tensor-type", "q3"], "--output-tensor-type: 'q3' is not a ggml type"),
    (["--override-kv", "general.name"], "has no key"),
    (["--override-kv", "a=int:x"], "'x' is not an integer"),
    (["--override-kv", "a=bool:yes"], "a bool is true or false"),
    (["--override-kv", "a=list:1"], "has no type"),
    (["--prune-layers", "1,-2"], "--prune-layers: invalid layer id"),
    (["--tensor-type-file", "/nonexistent/types.txt"], "--tensor-type-file: cannot open"),
    (["--output-tensor-type", "iq2_xxs"], "quantd does not write ggml type iq2_xxs"),
])
def test_bad_option_is_refused(models, tmp_path, args, says):
    out = tmp_path / "out.gguf"
    p = run_quantd("convert", "--in", models["llama"], "--out", out, *args, "--recipe", "Q4_K_M", check=False)
    assert p.returncode in (1, 2) and says in p.stderr, p.stderr
    assert not out.exists()


def test_option_value_missing(models, tmp_path):
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "Q4_0",
                   "--token-embedding-type", check=False)
    assert p.returncode == 2 and "--token-embedding-type needs a value" in p.stderr, p.stderr


def test_options_need_gguf_output(tmp_path):
    from conftest import TINY_HF
    src = tmp_path / "hf"
    subprocess.run([sys.executable, TINY_HF, str(src)], check=True)
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "o", "--fmt", "nf4", "--pure", check=False)
    assert p.returncode == 1 and "apply to GGUF output" in p.stderr, p.stderr
