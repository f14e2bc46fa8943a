"""GGUF conversion across architectures: quantd convert of the tiny models of
tests/checkpoint/tiny_gguf_arch.py (tied head with odd widths, q/k/v biases, fused qkv and
gate/up, Gemma-2, 8 experts as 3-D tensors, MLA with a shared expert) gives, tensor for tensor,
the types and bytes llama-quantize wrote for the same inputs with its mixes (--recipe) and with
--pure (--fmt): tests/fixtures/gguf_arch, made by tests/fixtures/make_gguf_arch_fixtures.py."""
import hashlib
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from conftest import FIXTURES, ROOT, run_quantd

TINY = os.path.join(ROOT, "tests", "checkpoint", "tiny_gguf_arch.py")
with open(os.path.join(FIXTURES, "gguf_arch", "llama_quantize.json")) as f:
    FIX = json.load(f)


def hashes(path):
    return {t.name: f"{t.tensor_type.name}:{hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()[:16]}"
            for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    made = {}
    for arch, dt in FIX["models"].items():
        made[arch] = d / f"{arch}.gguf"
        subprocess.run([sys.executable, TINY, str(made[arch]), arch, dt], check=True)
    return made


@pytest.mark.parametrize("key", sorted(FIX["cases"]))
def test_convert_equals_llama_quantize(models, tmp_path, key):
    arch, kind = key.split("/")
    out = tmp_path / "out.gguf"
    if kind.startswith("pure:"):
        run_quantd("convert", "--in", models[arch], "--out", out, "--fmt", kind[5:].replace("Q", "q"))
    else:
        run_quantd("convert", "--in", models[arch], "--out", out, "--recipe", kind)
    ours, ref = hashes(out), FIX["cases"][key]
    differ = sorted(n for n in ref if ours.get(n) != ref[n])
    assert not differ and set(ours) == set(ref), \
        f"{len(differ)} tensors differ: " + ", ".join(f"{n} {ours.get(n)} vs {ref[n]}" for n in differ[:4])
