"""quantd perplexity and quantd imatrix show their progress on stderr (server/cli/model_run.c):
off a terminal one JSON line a step (every block, then every chunk through the head, then done),
with --progress none nothing, and either way the same stdout and files; a bad --progress is
refused."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TINY = os.path.join(ROOT, "tests", "model", "tiny_model.py")
TOKENS = os.path.join(ROOT, "tests", "fixtures", "model", "tokens.bin")
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = tmp_path_factory.mktemp("progress") / "m.gguf"
    subprocess.run([sys.executable, TINY, str(m), "--layers", "3"], check=True, stdout=subprocess.DEVNULL)
    return m


def run(*args):
    p = subprocess.run([QUANTD, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p


def progress_lines(stderr):
    return [json.loads(line)["progress"] for line in stderr.splitlines() if line.startswith('{"progress"')]


@pytest.mark.parametrize("cmd", ["perplexity", "imatrix"])
def test_json_lines_off_a_terminal(model, tmp_path, cmd):
    args = [cmd, "-m", model, "--tokens", TOKENS, "-c", "64", "--chunks", "4", "-t", "2"]
    if cmd == "imatrix":
        args += ["-o", tmp_path / "a.gguf"]
    p = run(*args)
    steps = progress_lines(p.stderr)
    assert [(s["stage"], s["done"], s["total"]) for s in steps] == \
        [("layers", 1, 3), ("layers", 2, 3), ("layers", 3, 3)] + [("chunks", c, 4) for c in range(1, 5)] + \
        [("done", 4, 4)]
    if cmd == "imatrix":
        args[-1] = tmp_path / "b.gguf"
    q = run(*args, "--progress", "none")
    assert progress_lines(q.stderr) == []
    if cmd == "perplexity":  # the same lines and figures but for the run's time and memory
        strip = lambda out: [l for l in out.splitlines() if not l.startswith("{")]
        assert strip(p.stdout) == strip(q.stdout)
        a, b = json.loads(p.stdout.splitlines()[-1]), json.loads(q.stdout.splitlines()[-1])
        assert a["ln_ppl"] == b["ln_ppl"] and a["tokens_scored"] == b["tokens_scored"]
    else:
        assert p.stdout == q.stdout
        assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_bad_progress_is_refused(model):
    for cmd in ("perplexity", "imatrix"):
        p = subprocess.run([QUANTD, cmd, "-m", str(model), "--tokens", TOKENS, "--progress", "loud"],
                           capture_output=True, text=True)
        assert p.returncode == 2 and "--progress takes auto, bar, json or none" in p.stderr
