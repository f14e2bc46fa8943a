"""quantd tokenize against llama-tokenize, through the command line: its default output (one
"%6d -> 'piece'" line per token) byte for byte, escapes and where the text comes from (-p, -f,
--stdin), --ids / --show-count, llama.cpp's own vectors (models/ggml-vocab-*.gguf.inp/.out of the
llama-cpp-python 0.3.36 sdist, in QD_VOCAB_DIR: `make build/vocab/ok`) on three vocabularies, and
the refusals. tests/model/test_tokenizer.c checks every vector and the hard texts in-process."""
import base64
import json
import os
import subprocess

import pytest

from conftest import FIXTURES, QUANTD, ROOT

VOCAB_DIR = os.environ.get("QD_VOCAB_DIR", os.path.join(ROOT, "build", "vocab"))
EXPECTED = os.path.join(FIXTURES, "tokenizer", "expected.json")
SEP = b"\n__ggml_vocab_test__\n"


def vocab(name):
    path = os.path.join(VOCAB_DIR, f"ggml-vocab-{name}.gguf")
    if not os.path.exists(path):
        raise AssertionError(f"{path} missing: run 'make build/vocab/ok' (or set QD_VOCAB_DIR)")
    return path


def tokenize(*args, stdin=None):
    return subprocess.run([QUANTD, "tokenize", *map(str, args)], input=stdin, capture_output=True)


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED) as f:
        return json.load(f)


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2", "deepseek-coder"])
def test_vectors_through_the_cli_equal_llama_cpp(name):
    path = vocab(name)
    with open(path + ".inp", "rb") as f:
        raw = f.read()
    with open(path + ".out") as f:
        outs = f.read().split("\n")
    inputs = raw.split(SEP)
    if inputs[-1] == b"":  # (the file ends with a separator)
        inputs.pop()
    assert len(inputs) > 40
    for i, text in enumerate(inputs):
        p = tokenize("-m", path, "--stdin", "--ids", "--no-bos", "--no-parse-special", "--no-escape", stdin=text)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == [int(x) for x in outs[i].split()], (name, i, text[:60])


def test_default_output_equals_llama_tokenize_byte_for_byte(expected, tmp_path):
    assert len(expected["pieces"]) >= 40
    for case in expected["pieces"]:
        text = tmp_path / "text"
        text.write_bytes(base64.b64decode(expected["texts"][case["text"]]))
        p = tokenize("-m", vocab(case["vocab"]), "-f", text, "--no-escape")
        assert p.returncode == 0, p.stderr
        assert p.stdout == base64.b64decode(case["stdout"]), (case["vocab"], case["text"])


def test_escapes_and_text_sources_equal_llama_tokenize(expected, tmp_path):
    raw = expected["escape_text"]
    esc = tmp_path / "esc"
    esc.write_text(raw)
    for case in expected["escapes"]:
        args = [str(esc) if a.endswith("/esc") else a for a in case["args"]]
        p = tokenize("-m", vocab("llama-spm"), "--ids", *args, stdin=raw.encode() if "--stdin" in args else None)
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode() == case["stdout"], args


def test_stdin_comes_before_file_and_file_before_prompt(tmp_path):
    path = vocab("llama-spm")
    f = tmp_path / "t"
    f.write_bytes(b"file text\n")
    ids = lambda *a, stdin=None: json.loads(tokenize("-m", path, "--ids", *a, stdin=stdin).stdout)  # noqa: E731
    assert ids("-p", "prompt", "-f", f, "--stdin", stdin=b"from stdin") == ids("-p", "from stdin")
    assert ids("-p", "prompt", "-f", f) == ids("-p", "file text\\n")  # -f keeps the trailing newline
    assert ids("-f", f, "-p", "prompt") == ids("-p", "file text\\n")


def test_ids_show_count_and_empty_text(tmp_path):
    path = vocab("llama-spm")
    p = tokenize("-m", path, "-p", "Hello world", "--ids", "--show-count")
    assert p.stdout == b"[1, 15043, 3186]\nTotal number of tokens: 3\n"
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert tokenize("-m", path, "-f", empty, "--ids").stdout == b"[1]\n"
    assert tokenize("-m", path, "-f", empty, "--ids", "--no-bos").stdout == b"[]\n"
    p = tokenize("-m", path, "-p", "Hello", "--log-disable")
    assert p.stdout == b"     1 -> '<s>'\n 15043 -> ' Hello'\n"


def test_special_tokens_parse_unless_asked_not_to():
    path = vocab("llama-bpe")
    parsed = json.loads(tokenize("-m", path, "-p", "<|begin_of_text|>hi", "--ids", "--no-bos").stdout)
    plain = json.loads(tokenize("-m", path, "-p", "<|begin_of_text|>hi", "--ids", "--no-bos",
                                "--no-parse-special").stdout)
    assert parsed[0] == 128000 and 128000 not in plain and len(plain) > 2


def test_refusals_name_the_problem(tmp_path):
    path = vocab("llama-spm")
    for empty in ([], ["-p", ""]):
        p = tokenize("-m", path, *empty)
        assert p.returncode == 1 and b"must specify one of: --stdin, --file or --prompt" in p.stderr
    p = tokenize("-m", tmp_path / "none.gguf", "-p", "x")
    assert p.returncode == 1 and b"none.gguf" in p.stderr
    p = tokenize("-p", "x")
    assert p.returncode == 2 and b"-m MODEL" in p.stderr
    p = tokenize("-m", path, "-p", "x", "--bogus")
    assert p.returncode == 2 and b"--bogus" in p.stderr
    p = tokenize("-m", path, "-f", tmp_path / "missing.txt")
    assert p.returncode == 1 and b"missing.txt" in p.stderr
    novocab = tmp_path / "novocab.gguf"  # a GGUF with one key and no vocabulary
    key, val = b"general.architecture", b"llama"
    novocab.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                        + len(key).to_bytes(8, "little") + key + (8).to_bytes(4, "little")
                        + len(val).to_bytes(8, "little") + val)
    p = tokenize("-m", novocab, "-p", "x")
    assert p.returncode == 1 and b"no vocabulary" in p.stderr
    # a four-byte form past U+10FFFF: llama.cpp's BPE throws; quantd says so
    p = tokenize("-m", vocab("gpt-2"), "--stdin", "--no-escape", stdin=b"a \xf4\x90\x80\x80")
    assert p.returncode == 1 and b"U+10FFFF" in p.stderr
