"""The forward engine's CUDA backend against its CPU backend (a machine with a GPU; make
test-gpu-model). For every tiny model of tests/model/cases.py (each architecture, MoE and MLA
included), quantd perplexity's logits and ln PPL and quantd imatrix's sums on --backend cuda
against --backend cpu, both with an f32 KV cache (-ctk f32 -ctv f32): the CPU is the f32
reference; CUDA rounds every matmul's inputs to bf16 (f32 sums), so its figures differ by
bf16's rounding carried through the layers. The bounds below are the stated bound of the CUDA
backend (docs/BENCHMARKS.md records the measured figures), per row of logits the largest
difference over the row's largest logit; they are not loosened to pass.

Also: a device-memory cap too small for one block is refused with a message naming
--max-device-bytes, and a cap that forces the chunks through one at a time gives the same
figures within the same bound."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
from cases import CASES, FIXTURES, N_CHUNKS, N_CTX, make_model, read_logits  # noqa: E402

QUANTD = os.environ.get("QUANTD", os.path.join(HERE, "..", "..", "bin", "quantd"))
TOKENS = os.path.join(FIXTURES, "tokens.bin")

# bf16 keeps 8 significant bits (a relative rounding of 2^-9 = 2e-3 per input); through 2-3
# blocks of tiny models the logits move by a few times that
ROW_BOUND = 2e-2        # worst row: max |d logit| / max |logit|
LN_PPL_BOUND = 2e-3     # relative difference of ln PPL
IMATRIX_BOUND = 2e-2    # relative difference of each importance value (sums of squares)


def perplexity(model, backend, dump, *extra):
    p = subprocess.run([QUANTD, "perplexity", "-m", str(model), "--tokens", TOKENS, "-c", str(N_CTX), "--chunks",
                        str(N_CHUNKS), "-ctk", "f32", "-ctv", "f32", "--backend", backend, "--dump-logits", str(dump),
                        *map(str, extra)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {case: make_model(case, d / (case + ".gguf")) for case in CASES}


def n_vocab_of(case):
    with open(os.path.join(FIXTURES, case + ".json")) as f:
        return json.load(f)["n_vocab"]


def compare(case, cpu_dump, gpu_dump, cpu, gpu, label):
    n_vocab = n_vocab_of(case)
    a = read_logits(cpu_dump, n_vocab).astype(np.float64)
    b = read_logits(gpu_dump, n_vocab).astype(np.float64)
    assert a.shape == b.shape
    rows = np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)
    d_ppl = abs(gpu["ln_ppl"] - cpu["ln_ppl"]) / abs(cpu["ln_ppl"])
    print(f"{case} {label}: worst row {rows.max():.2e}, median row {np.median(rows):.2e}, ln PPL {d_ppl:.2e}")
    assert rows.max() < ROW_BOUND, rows.max()
    assert d_ppl < LN_PPL_BOUND, (gpu["ln_ppl"], cpu["ln_ppl"])


@pytest.mark.parametrize("case", list(CASES))
def test_cuda_logits_within_bound_of_cpu(models, tmp_path, case):
    cpu = perplexity(models[case], "cpu", tmp_path / "cpu.bin")
    gpu = perplexity(models[case], "cuda", tmp_path / "gpu.bin")
    assert cpu["backend"] == "cpu" and gpu["backend"] == "cuda"
    assert gpu["memory"]["device_peak_bytes"] > 0
    compare(case, tmp_path / "cpu.bin", tmp_path / "gpu.bin", cpu, gpu, "cuda")


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3moe", "deepseek2"])
def test_cuda_imatrix_within_bound_of_cpu(models, tmp_path, case):
    from gguf import GGUFReader  # noqa: E402 (the gguf package, as tests/peers use it)
    out = {}
    for backend in ("cpu", "cuda"):
        path = tmp_path / f"{backend}.imatrix.gguf"
        p = subprocess.run([QUANTD, "imatrix", "-m", str(models[case]), "--tokens", TOKENS, "-c", str(N_CTX),
                            "--chunks", str(N_CHUNKS), "-ctk", "f32", "-ctv", "f32", "--backend", backend, "-o",
                            str(path)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        out[backend] = {t.name: np.array(t.data, dtype=np.float64) for t in GGUFReader(str(path)).tensors}
    assert out["cpu"].keys() == out["cuda"].keys()
    worst = 0.0
    for name, a in out["cpu"].items():
        b = out["cuda"][name]
        if name.endswith(".counts"):
            assert np.array_equal(a, b), name
            continue
        worst = max(worst, float((np.abs(a - b) / np.maximum(np.abs(a), 1e-30)).max()))
    print(f"{case} imatrix: worst value {worst:.2e}")
    assert worst < IMATRIX_BOUND


def test_cap_too_small_for_a_block_is_refused(models, tmp_path):
    p = subprocess.run([QUANTD, "perplexity", "-m", str(models["llama-gqa"]), "--tokens", TOKENS, "-c", str(N_CTX),
                        "--backend", "cuda", "--max-device-bytes", "1MiB"], capture_output=True, text=True)
    assert p.returncode != 0
    assert "--max-device-bytes" in p.stderr, p.stderr


def test_capped_run_within_bound(models, tmp_path):
    """256 MiB: the backend's own scratch (3 x 64 + 4 MiB) and a little for the model."""
    case = "llama-gqa"
    cpu = perplexity(models[case], "cpu", tmp_path / "cpu.bin")
    gpu = perplexity(models[case], "cuda", tmp_path / "gpu.bin", "--max-device-bytes", "256MiB")
    assert gpu["memory"]["device_peak_bytes"] <= 256 << 20
    compare(case, tmp_path / "cpu.bin", tmp_path / "gpu.bin", cpu, gpu, "cuda under 256 MiB")
