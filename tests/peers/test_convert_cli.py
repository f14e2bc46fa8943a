"""quantd convert as a user meets it: a directory destination is a directory, slash or not, and
nothing the user owns is deleted; one overwrite rule (--force) for every layout; the input checked
against the format, with what the format needs, before anything is converted; names in any case,
with a hint where a format is a recipe or the other way round; the help listing every format that
converts; and a stop signal that leaves no temporary behind."""
import json
import os
import signal
import subprocess
import sys

import gguf
import pytest

from conftest import QUANTD, ROOT, run_quantd, tiny_hf

TINY_GGUF = os.path.join(ROOT, "tests", "checkpoint", "tiny_gguf.py")


def tiny_gguf(path, dtype="f16", *args):
    subprocess.run([sys.executable, TINY_GGUF, str(path), dtype, *map(str, args)], check=True)
    return path


def tensor_lines(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"tensor"')]


def leftovers(d):
    """quantd's temporary names anywhere under d."""
    return [os.path.join(r, n) for r, ds, fs in os.walk(d) for n in ds + fs if ".quantd-" in n]


def test_a_directory_destination_is_a_directory_slash_or_not(tmp_path, monkeypatch):
    src = tiny_hf(tmp_path / "Llama-dir")
    monkeypatch.chdir(tmp_path)
    # the README's form, both with a trailing slash
    run_quantd("convert", "--in", "Llama-dir/", "--out", "Llama-nf4/", "--fmt", "nf4")
    assert sorted(os.listdir("Llama-nf4")) == sorted(os.listdir(src))
    # an existing empty directory receives the files and is kept (the same directory)
    os.mkdir("empty")
    before = os.stat("empty").st_ino
    run_quantd("convert", "--in", "Llama-dir", "--out", "empty/", "--fmt", "nf4")
    assert os.stat("empty").st_ino == before and "config.json" in os.listdir("empty")
    assert open("empty/model.safetensors", "rb").read() == open("Llama-nf4/model.safetensors", "rb").read()
    # a GGUF is one file: a directory destination is refused before any tensor is converted
    tiny_gguf(tmp_path / "m.gguf")
    os.mkdir("sub")
    for out in ("sub/", "sub", "new/"):
        p = run_quantd("convert", "--in", "m.gguf", "--out", out, "--fmt", "q4_0", check=False)
        assert p.returncode == 1 and "one file" in p.stderr and "model.gguf" in p.stderr, (out, p.stderr)
        assert tensor_lines(p.stdout) == [], out
    assert os.listdir("sub") == [] and not os.path.exists("new")
    # a destination whose directory is missing, or under a file: said before converting
    p = run_quantd("convert", "--in", "m.gguf", "--out", "no/x.gguf", "--fmt", "q4_0", check=False)
    assert p.returncode == 1 and "does not exist" in p.stderr and tensor_lines(p.stdout) == []
    p = run_quantd("convert", "--in", "m.gguf", "--out", "m.gguf/x.gguf", "--fmt", "q4_0", check=False)
    assert p.returncode == 1 and "not a directory" in p.stderr and tensor_lines(p.stdout) == []
    p = run_quantd("convert", "--in", "m.gguf", "--out", "x" * 250 + ".gguf", "--fmt", "q4_0", check=False)
    assert p.returncode == 1 and "name is 255 bytes long" in p.stderr and tensor_lines(p.stdout) == []
    assert leftovers(tmp_path) == []


def test_one_overwrite_rule_for_every_layout(tmp_path):
    src = tiny_hf(tmp_path / "hf")
    g = tiny_gguf(tmp_path / "m.gguf")
    # a GGUF file, a safetensors file, a directory: each refused when it exists, kept as it was
    cases = [(g, tmp_path / "o.gguf", "q8_0"), (src / "model.safetensors", tmp_path / "o.safetensors", "nf4"),
             (src, tmp_path / "o", "w4a16")]
    for i, o, fmt in cases:
        if fmt == "w4a16":
            o.mkdir()
            (o / "mine.txt").write_text("the user's")
        else:
            o.write_bytes(b"the user's")
        p = run_quantd("convert", "--in", i, "--out", o, "--fmt", fmt, check=False)
        assert p.returncode == 1 and "exists" in p.stderr and "--force" in p.stderr, (fmt, p.stderr)
        assert tensor_lines(p.stdout) == [], fmt
        assert (o / "mine.txt" if fmt == "w4a16" else o).read_bytes() == b"the user's", fmt
        # --force replaces it (a directory: files of the same names; the user's others stay)
        run_quantd("convert", "--in", i, "--out", o, "--fmt", fmt, "--force")
        if fmt == "w4a16":
            assert (o / "mine.txt").read_text() == "the user's" and (o / "config.json").exists()
            assert "quantization_config" in json.loads((o / "config.json").read_text())
        else:
            assert o.read_bytes() != b"the user's" and o.stat().st_size > 1000
    p = run_quantd("convert", "--in", g, "--out", g, "--fmt", "q8_0", "--force", check=False)
    assert p.returncode == 1 and "is the input" in p.stderr
    assert leftovers(tmp_path) == []


def test_wrong_input_for_the_format_says_what_it_needs(tmp_path):
    src = tiny_hf(tmp_path / "hf")
    g = tiny_gguf(tmp_path / "m.gguf")
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "o.gguf", "--fmt", "q4_0", check=False)
    assert p.returncode == 1 and "convert_hf_to_gguf.py" in p.stderr and "Hugging Face" in p.stderr, p.stderr
    p = run_quantd("convert", "--in", src / "model.safetensors", "--out", tmp_path / "o.gguf", "--fmt", "q4_0",
                   check=False)
    assert p.returncode == 1 and "is a safetensors file" in p.stderr and "GGUF" in p.stderr, p.stderr
    assert "magic" not in p.stderr
    for fmt in ("nf4", "awq", "w4a16", "nvfp4"):
        p = run_quantd("convert", "--in", g, "--out", tmp_path / "o", "--fmt", fmt, check=False)
        assert p.returncode == 1 and "is a GGUF file" in p.stderr and "Hugging Face model" in p.stderr, p.stderr
        assert "header length" not in p.stderr and "q4_0" in p.stderr  # what a GGUF converts to
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = subprocess.run([QUANTD, "convert", "--in", fifo, "--out", tmp_path / "o.gguf", "--fmt", "q4_0"],
                       capture_output=True, text=True, timeout=60)  # (a FIFO is never opened: no writer needed)
    assert p.returncode == 1 and "not a regular file" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["fifo", "hf", "m.gguf"]


def test_names_in_any_case_with_hints(tmp_path):
    g = tiny_gguf(tmp_path / "m.gguf")
    run_quantd("convert", "--in", g, "--out", tmp_path / "a.gguf", "--fmt", "q4_0")
    run_quantd("convert", "--in", g, "--out", tmp_path / "b.gguf", "--fmt", "Q4_0")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    p = run_quantd("convert", "--in", g, "--out", tmp_path / "c.gguf", "--fmt", "q4_k_m", check=False)
    assert p.returncode == 2 and "--recipe Q4_K_M" in p.stderr
    p = run_quantd("convert", "--in", g, "--out", tmp_path / "c.gguf", "--recipe", "nf4", check=False)
    assert p.returncode == 2 and "--fmt nf4" in p.stderr
    p = run_quantd("convert", "--in", g, "--out", tmp_path / "c.gguf", "--fmt", "q4_0", "--recipe", "Q4_K_M",
                   check=False)
    assert p.returncode == 2 and "not both" in p.stderr
    # a mix in any case; each tensor's line names the type written (output.weight: q6_K)
    p = run_quantd("convert", "--in", g, "--out", tmp_path / "m1.gguf", "--recipe", "q4_k_m")
    run_quantd("convert", "--in", g, "--out", tmp_path / "m2.gguf", "--recipe", "Q4_K_M")
    assert (tmp_path / "m1.gguf").read_bytes() == (tmp_path / "m2.gguf").read_bytes()
    written = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(str(tmp_path / "m1.gguf")).tensors}
    lines = tensor_lines(p.stdout)
    assert {line["name"]: line["fmt"] for line in lines}["output.weight"] == "q6_K"
    for line in lines:
        if line["fmt"] not in ("copied", "f16"):
            assert line["fmt"].lower() == written[line["name"]], line


def test_help_lists_every_format_that_converts(tmp_path):
    """The formats --help names are exactly those a conversion accepts (each tried on a tiny
    model of the kind it reads, with an importance matrix where it asks for one); the top-level
    help shows --recipe; --version is VERSION's."""
    src, g = tiny_hf(tmp_path / "hf", "--tokenizer"), tiny_gguf(tmp_path / "m.gguf")  # mlx-lm needs a tokenizer
    imatrix = tmp_path / "m.imatrix"
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", "tiny_imatrix.py"), g, imatrix, "gguf"],
                   check=True)
    names = [f["name"] for f in json.loads(run_quantd("formats").stdout)["formats"]]
    help_words = run_quantd("convert", "--help").stdout.split("\n  --recipe MIX")[0].split()
    listed = {w for w in help_words if w in names}
    imatrix = tmp_path / "m.imatrix.gguf"  # iq3_xxs, iq1_s, iq1_m: llama-quantize needs one too
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", "tiny_imatrix.py"), str(g), str(imatrix),
                    "gguf"], check=True)
    converts = set()
    for name in names:
        for i, o in ((g, tmp_path / f"{name}.gguf"), (src, tmp_path / name)):
            p = run_quantd("convert", "--in", i, "--out", o, "--fmt", name, check=False)
            if p.returncode and "requires an importance matrix" in p.stderr:
                p = run_quantd("convert", "--in", i, "--out", o, "--fmt", name, "--imatrix", imatrix, check=False)
            if p.returncode == 0:
                converts.add(name)
    assert {"w4a16", "w8a16", "nvfp4", "mxfp4", "awq", "nf4", "q4_K"} <= converts
    assert listed == converts
    assert "--recipe" in run_quantd("--help").stdout
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    assert run_quantd("--version").stdout == f"quantd {version}\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_leaves_no_temporary(tmp_path, sig):
    """The signal comes while the conversion runs (the process is stopped at its first tensor's
    line, signalled, continued): it stops, removes what it wrote, exits 128 + the signal."""
    src = tiny_gguf(tmp_path / "big.gguf", "f32", "--hidden", 1024, "--ffn", 2048, "--layers", 4)
    out = tmp_path / "out.gguf"
    p = subprocess.Popen([QUANTD, "convert", "--in", src, "--out", out, "--fmt", "q4_K", "--backend", "cpu"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    assert first.startswith('{"tensor"'), first
    p.send_signal(signal.SIGSTOP)
    p.send_signal(sig)
    p.send_signal(signal.SIGCONT)
    rest, err = p.communicate(timeout=60)
    assert p.returncode in (128 + sig, -sig), (p.returncode, err)
    assert p.returncode == 128 + sig and "nothing was written" in err, err
    assert sorted(os.listdir(tmp_path)) == ["big.gguf"]


def test_a_reader_that_goes_away_does_not_stop_the_conversion(tmp_path):
    """The JSON lines go to a pipe whose reader has left: the conversion goes on to its end
    (the lines are lost, not the output)."""
    src = tiny_gguf(tmp_path / "m.gguf", "f32", "--layers", 8)
    out = tmp_path / "out.gguf"
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([QUANTD, "convert", "--in", src, "--out", out, "--fmt", "q8_0"], stdout=w,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert p.returncode == 0, (p.returncode, p.stderr)
    assert out.stat().st_size > 0 and leftovers(tmp_path) == []
