#!/usr/bin/env python3
"""The files tests/server/test_model_jobs.c runs perplexity and imatrix jobs over, written into a
data directory: tiny seeded llama models of tests/model/tiny_model.py (m.gguf; slow.gguf, wider
and deeper, for a run long enough to cancel), the same model with its architecture renamed
(phi2.gguf: one the engine lacks) and without its vocabulary (bare.gguf), the text of
tests/fixtures/model and its ids (text.txt, tokens.bin), those ids eight times over (long.bin),
and a text shorter than one chunk (short.txt).

    model_fixtures.py DIR
"""
import os
import shutil
import subprocess
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TINY = os.path.join(ROOT, "tests", "model", "tiny_model.py")
TEXT = os.path.join(ROOT, "tests", "fixtures", "model")


def rewritten(src, dst, drop_prefix=None, arch=None):
    """A copy of a GGUF with keys dropped or the architecture renamed."""
    r = gguf.GGUFReader(src)
    old = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch or old)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or (drop_prefix and name.startswith(drop_prefix)):
            continue
        key = name.replace(old + ".", (arch or old) + ".", 1)
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), field.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(d):
    m = os.path.join(d, "m.gguf")
    subprocess.run([sys.executable, TINY, m], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, TINY, os.path.join(d, "slow.gguf"), "--hidden", "128", "--ffn", "512",
                    "--layers", "8"], check=True, stdout=subprocess.DEVNULL)
    rewritten(m, os.path.join(d, "phi2.gguf"), arch="phi2")
    rewritten(m, os.path.join(d, "bare.gguf"), drop_prefix="tokenizer.")
    for name in ("text.txt", "tokens.bin"):
        shutil.copy(os.path.join(TEXT, name), os.path.join(d, name))
    with open(os.path.join(TEXT, "tokens.bin"), "rb") as f:
        ids = f.read()
    with open(os.path.join(d, "long.bin"), "wb") as f:
        f.write(ids * 8)
    with open(os.path.join(d, "short.txt"), "w") as f:
        f.write("Too short for a chunk.\n")


if __name__ == "__main__":
    main(sys.argv[1])
