"""quantd convert against llama.cpp itself (make test-consumers builds llama-quantize and
llama-completion from the llama.cpp sources vendored in the llama-cpp-python sdist and points
LLAMA_CPP_BIN at them): for tiny Llama GGUFs in F32, F16 and BF16 (one with an FFN width that
is not a multiple of 32, and for the K-quants one whose FFN width is 288: 32-block fallbacks),
`quantd convert --fmt T` equals `llama-quantize --pure <in> <out> T`
byte for byte (so llama.cpp computes the same logits from both), and llama.cpp loads and runs
quantd's file; and `quantd convert --recipe MIX` equals `llama-quantize <in> <out> MIX` (its
type mixes, no --pure). (Its console output is not compared: llama-completion's stdout of a greedy run on
this random model varies between runs of the same file, even on one thread.)"""
import os
import subprocess
import sys

import pytest

from conftest import QUANTD, run_quantd  # noqa: E402

BIN = os.environ.get("LLAMA_CPP_BIN", "")
TINY = os.path.join(os.path.dirname(__file__), "..", "checkpoint", "tiny_gguf.py")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "llama-quantize")),
                                reason="LLAMA_CPP_BIN is not set (make test-consumers builds llama.cpp)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    out = {}
    for dt in ("f32", "f16", "bf16"):
        for kind, extra in (("plain", []), ("odd", ["--ffn", "100"]), ("odd256", ["--ffn", "288"])):
            p = d / f"{kind}_{dt}.gguf"
            subprocess.run([sys.executable, TINY, str(p), dt, *extra], check=True)
            out[(kind, dt)] = p
    # for the mixes: more layers and a GQA ratio of 4, where their rules differ by layer and ratio
    p = d / "deep_bf16.gguf"
    subprocess.run([sys.executable, TINY, str(p), "bf16", "--layers", "16", "--heads", "8", "--kv-heads", "2"],
                   check=True)
    out[("deep", "bf16")] = p
    return out


def complete(model):
    # --no-repack: the CPU backend's repacked matrix kernels of this llama.cpp crash on an AVX-512
    # machine for any quantized file, llama-quantize's own included; the plain kernels run it
    p = subprocess.run([os.path.join(BIN, "llama-completion"), "-m", str(model), "-p", "the quantize model",
                        "-n", "16", "--temp", "0", "--seed", "1", "-t", "1", "-no-cnv", "--no-repack"],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


LEGACY, KQUANTS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"], ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
CASES = [(k, d, q) for d in ("f32", "f16", "bf16") for q in LEGACY + KQUANTS
         for k in (["plain", "odd"] + (["odd256"] if q in KQUANTS else []))]  # 288: only K rows fall back


@pytest.mark.parametrize("kind,dtype,qtype", CASES)
def test_convert_equals_llama_quantize_pure(models, tmp_path, kind, dtype, qtype):
    src = models[(kind, dtype)]
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    p = subprocess.run([os.path.join(BIN, "llama-quantize"), "--pure", str(src), str(ref), qtype, "2"],
                       capture_output=True)
    assert p.returncode == 0, p.stderr[-2000:]
    run_quantd("convert", "--in", src, "--out", ours, "--fmt", qtype.lower().replace("_k", "_K"))
    a, b = ref.read_bytes(), ours.read_bytes()
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    assert a == b, f"sizes {len(a)}/{len(b)}, first differing byte {first}"
    if kind == "plain" and dtype == "bf16":  # llama.cpp loads and runs it (same bytes: same logits)
        assert complete(ours).startswith("▁the▁quantize▁model".encode())


MIXES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
         "Q5_K_M", "Q6_K"]


@pytest.mark.parametrize("kind,dtype", [("plain", "f16"), ("odd", "f32"), ("deep", "bf16")])
@pytest.mark.parametrize("mix", MIXES)
def test_recipe_equals_llama_quantize(models, tmp_path, kind, dtype, mix):
    """--recipe MIX against llama-quantize MIX (no --pure): its per-tensor type rules"""
    src = models[(kind, dtype)]
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    p = subprocess.run([os.path.join(BIN, "llama-quantize"), str(src), str(ref), mix, "2"], capture_output=True)
    assert p.returncode == 0, p.stderr[-2000:]
    run_quantd("convert", "--in", src, "--out", ours, "--recipe", mix)
    a, b = ref.read_bytes(), ours.read_bytes()
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    assert a == b, f"sizes {len(a)}/{len(b)}, first differing byte {first}"
    if kind == "deep" and mix == "Q4_K_M":
        assert complete(ours).startswith("▁the▁quantize▁model".encode())


IMX = os.path.join(os.path.dirname(__file__), "..", "checkpoint", "tiny_imatrix.py")
# the mixes llama-quantize writes from an importance matrix, the IQ and ternary types among them
IMATRIX_MIXES = ["IQ4_XS", "IQ4_NL", "IQ3_S", "IQ3_M", "IQ3_XXS", "IQ3_XS", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS",
                 "IQ1_M", "IQ1_S", "TQ1_0", "TQ2_0", "Q2_K_S", "Q4_K_M"]


@pytest.mark.parametrize("mix", IMATRIX_MIXES)
def test_imatrix_mix_equals_llama_quantize_and_runs(models, tmp_path, mix):
    """--recipe MIX --imatrix against llama-quantize --imatrix: the same bytes, and llama.cpp loads
    quantd's file and generates from it (the same bytes: the same logits as llama-quantize's)"""
    src = models[("deep", "bf16")]
    imx = tmp_path / "imatrix.gguf"
    subprocess.run([sys.executable, IMX, str(src), str(imx), "gguf"], check=True)
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    p = subprocess.run([os.path.join(BIN, "llama-quantize"), "--imatrix", str(imx), str(src), str(ref), mix, "2"],
                       capture_output=True)
    assert p.returncode == 0, p.stderr[-2000:]
    run_quantd("convert", "--in", src, "--out", ours, "--recipe", mix, "--imatrix", imx)
    a, b = ref.read_bytes(), ours.read_bytes()
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    assert a == b, f"sizes {len(a)}/{len(b)}, first differing byte {first}"
    assert complete(ours).startswith("▁the▁quantize▁model".encode())
