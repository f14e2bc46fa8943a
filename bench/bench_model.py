#!/usr/bin/env python3
"""make bench-model: the forward engine's speed (quantd imatrix, quantd perplexity and its KL
divergence) against the pass's bound and against llama.cpp's tools. Not run in CI.

usage: bench_model.py --mode gpu WORKDIR [--size 8b|1b|300m|tiny] [-c 512] [--chunks 100] [--cap 4GiB]
                      [--repeat 3] [--llama-repeat 1] [--warm-up 1] [--only all|quantd|llama] [--json OUT]
       bench_model.py --mode cpu WORKDIR --model GGUF [--text FILE] [-c 512] [--chunks 10]
                      [--repeat 3] [--json OUT]

gpu: writes bench/bench_convert.py's SIZES[size]-shaped BF16 GGUF with its writer
     (tests/checkpoint/tiny_gguf.py: a SentencePiece vocabulary with byte fallback, which quantd's
     tokenizer and llama.cpp's load; context length raised to cover -c) and chunks x c random token
     ids (little-endian int32, seed 0); times `cat` of the model (page cache warm), and on `--backend
     cuda`, uncapped and with `--max-device-bytes CAP`: `quantd imatrix --tokens`, `quantd perplexity
     --tokens --kl-divergence-base B` (writing B) and then `--kl-divergence` (reading it; the model
     against itself: the timing is the pass's). The bound is max(cat seconds, FLOPs / rate): FLOPs
     = 2 x the matrix weights' parameters (the output head included, the embedding lookup not) x
     tokens, plus causal attention's 2 x c^2 x heads x head_dim per block and chunk; rate: a bf16
     8192^3 torch.matmul on the GPU (best of 5 x 20; TORCH_PYTHON, else .venv-torch, else this
     Python; without torch or a GPU the rate is left out with a note and the bound is the read's).
     With LLAMA_CPP_BIN pointing at a CUDA build of llama.cpp (its --list-devices names a CUDA
     device): llama-imatrix and llama-perplexity (--kl-divergence-base, then --kl-divergence)
     with -ngl 99 on the same model. llama.cpp's tools read text only (-bf/--binary-file is the
     prompt's bytes, tokenized), and random ids cannot be detokenized into a text that gives them
     back, so the llama.cpp tools get a generated text (random lowercase words, WORKDIR/text.txt)
     that the model's vocabulary tokenizes (quantd tokenize, llama-tokenize's ids) to at least
     chunks x c tokens: the same token count, model and shapes, so the same work, with other ids.
     quantd flags that this build lacks (`quantd imatrix --help` does not name them: --backend,
     --max-device-bytes) give a row "flag missing" instead of a run.
cpu: on 2 cores (taskset -c 0,1; -t 2 for every tool): quantd imatrix and quantd perplexity
     against llama-imatrix and llama-perplexity (LLAMA_CPP_BIN), all given the same -f TEXT (default:
     tests/fixtures/model/text.txt repeated to chunks x c tokens of the model's vocabulary) and
     model (SmolLM2-135M-Instruct F16 is the intended one: make bench-model BENCH_MODEL_MODE=cpu
     makes it), -c and --chunks; the page cache warmed by a `cat` of the model first.
Every figure is the median of --repeat runs (quantd on the GPU after --warm-up untimed runs,
default 1: the CUDA context's first start; llama.cpp's tools --llama-repeat runs, no warm-up),
printed and written to --json (default WORKDIR/bench-model.json) with the command that made it.
--only quantd / --only llama runs one side's rows (the bound's rows always): the two halves of one
comparison on a machine held for a short time."""
import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_convert  # noqa: E402 (SIZES and the BF16 GGUF writer)

ROOT = os.path.dirname(HERE)
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))
GEMM = """
import json, time, torch
if not torch.cuda.is_available():
    print(json.dumps({"note": "torch sees no CUDA device"})); raise SystemExit
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    torch.matmul(a, b)
torch.cuda.synchronize()
best = 0.0
for _ in range(5):
    t = time.perf_counter()
    for _ in range(20):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    best = max(best, 20 * 2 * n ** 3 / (time.perf_counter() - t))
print(json.dumps({"flops_per_s": best, "device": torch.cuda.get_device_name()}))
"""


def shown(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


def run_once(cmd):
    t = time.perf_counter()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    return time.perf_counter() - t, p


def timed(rows, name, cmd, repeat, warm_up=0):
    """Runs cmd (warm_up untimed runs, then `repeat` times): a row with the median wall seconds,
    each run's, and quantd's JSON summary line when it prints one; a failed run gives a row with
    its error."""
    row = {"case": name, "command": shown(cmd), "warm_up_runs": int(warm_up)}
    walls = []
    for i in range(repeat + int(warm_up)):
        wall, p = run_once(cmd)
        if p.returncode:
            row["error"] = f"exit {p.returncode}: {(p.stderr.strip() or p.stdout.strip())[-1500:]}"
            print(f"# {name}: FAILED ({row['error'][-300:]})", flush=True)
            rows.append(row)
            return row
        if i >= int(warm_up):
            walls.append(wall)
    last = (p.stdout.strip().splitlines() or [""])[-1]
    if last.startswith("{"):
        row["summary"] = json.loads(last)
    row.update(seconds=statistics.median(walls), runs=walls)
    print(f"# {name}: {row['seconds']:.2f} s (runs {', '.join(f'{w:.2f}' for w in walls)})", flush=True)
    rows.append(row)
    return row


def noted(rows, name, cmd, note):
    rows.append({"case": name, "command": shown(cmd) if cmd else None, "note": note})
    print(f"# {name}: {note}", flush=True)


def missing_flags(sub, flags):
    """The flags `quantd SUB --help` does not name (this build lacks them)."""
    p = subprocess.run([QUANTD, sub, "--help"], capture_output=True, text=True)
    return [f for f in flags if f not in p.stdout + p.stderr]


def token_count(model, text):
    """The text's token count under the model's vocabulary (quantd tokenize: llama-tokenize's ids)."""
    p = subprocess.run([QUANTD, "tokenize", "-m", model, "-f", text, "--ids"], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"quantd tokenize -m {model} -f {text} failed: {p.stderr.strip()[-1500:]}")
    return len(json.loads(p.stdout.strip().splitlines()[-1]))


def text_of(model, path, need, seed_text=None):
    """A text at `path` of at least `need` tokens: seed_text repeated, or random lowercase words."""
    if os.path.exists(path) and token_count(model, path) >= need:
        return path
    rng = random.Random(0)

    def words(n):
        return " ".join("".join(rng.choice("etaoinshrdlucmfwypvbgk") for _ in range(rng.randint(1, 9)))
                        for _ in range(n))
    part = seed_text if seed_text is not None else words(max(64, need // 4))
    body = part
    while True:
        with open(path, "w", encoding="utf-8") as f:
            f.write(body + "\n")
        if token_count(model, path) >= need:
            return path
        body += "\n" + (part if seed_text is not None else words(max(64, need // 4)))


def forward_flops(shape, ctx, chunks):
    h, ffn, layers, heads, kv, vocab = shape
    hd = h // heads
    matrix_params = layers * (2 * h * h + 2 * kv * hd * h + 3 * h * ffn) + vocab * h
    return 2 * matrix_params * ctx * chunks + layers * 2 * ctx * ctx * heads * hd * chunks, matrix_params


def gemm_rate(rows):
    py = os.environ.get("TORCH_PYTHON") or next(
        (p for p in (os.path.join(ROOT, ".venv-torch", "bin", "python"),) if os.path.exists(p)), sys.executable)
    p = subprocess.run([py, "-c", GEMM], capture_output=True, text=True)
    row = {"case": "bf16 8192^3 GEMM rate (torch.matmul on cuda)", "command": shown([py, "-c", "GEMM"]),
           "GEMM": GEMM}
    got = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else \
        {"note": f"torch is not importable by {py}: no GEMM rate ({p.stderr.strip().splitlines()[-1:]})"}
    row.update(got)
    print(f"# {row['case']}: " + (f"{got['flops_per_s'] / 1e12:.0f} TFLOP/s ({got['device']})"
                                   if "flops_per_s" in got else got["note"]), flush=True)
    rows.append(row)
    return got.get("flops_per_s")


def llama_cuda(bin_dir):
    """None when LLAMA_CPP_BIN's llama.cpp can run on a CUDA device, else why not."""
    tool = os.path.join(bin_dir, "llama-imatrix")
    if not bin_dir or not os.path.exists(tool):
        return "LLAMA_CPP_BIN is not set or has no llama-imatrix: llama.cpp's tools left out"
    p = subprocess.run([tool, "--list-devices"], capture_output=True, text=True)
    if "CUDA" not in p.stdout + p.stderr:
        return (f"{bin_dir}'s llama.cpp lists no CUDA device (--list-devices): build it with -DGGML_CUDA=ON "
                "-DCMAKE_CUDA_ARCHITECTURES=90 for this comparison")
    return None


def gpu_mode(a, rows, info):
    shape = bench_convert.SIZES[a.size]
    model = os.path.join(a.work, f"{a.size}-bf16.gguf")
    bench_convert.make_gguf(model, a.size, ["--ctx", str(max(4096, a.ctx))])
    n = a.chunks * a.ctx
    ids = os.path.join(a.work, f"ids-{a.chunks}x{a.ctx}.bin")
    if not os.path.exists(ids):
        import numpy as np
        np.random.default_rng(0).integers(0, shape[5], n, dtype=np.int32).astype("<i4").tofile(ids)
    flops, params = forward_flops(shape, a.ctx, a.chunks)
    info.update(model=model, model_bytes=os.path.getsize(model), size=a.size, tokens=n, matrix_params=params,
                flops=flops, tokens_file=ids)
    cat = timed(rows, "cat model > /dev/null (page cache warm)", ["sh", "-c", f"cat '{model}' > /dev/null"],
                a.repeat, warm_up=1)
    rate = gemm_rate(rows)
    bound = max(cat["seconds"], flops / rate) if rate else cat["seconds"]
    info["bound"] = {"seconds": bound, "cat_seconds": cat["seconds"], "flops": flops, "gemm_flops_per_s": rate,
                     "compute_seconds": flops / rate if rate else None,
                     "command": "max(cat seconds, FLOPs / GEMM rate)" if rate else
                     "cat seconds (no GEMM rate: torch or a GPU missing)"}
    print(f"# bound: {bound:.2f} s ({info['bound']['command']}; FLOPs {flops:.3e})", flush=True)
    out, base = os.path.join(a.work, "quantd-imatrix.gguf"), os.path.join(a.work, "quantd-base.kld")
    common = ["-m", model, "--tokens", ids, "-c", a.ctx, "--chunks", a.chunks]
    runs = (("imatrix", "quantd imatrix", [*common, "-o", out]),
            ("perplexity", "quantd perplexity --kl-divergence-base (writes it)",
             [*common, "--kl-divergence-base", base]),
            ("perplexity", "quantd perplexity --kl-divergence", [*common, "--kl-divergence-base", base,
                                                                 "--kl-divergence"]))
    for cap in (None, a.cap) if a.only != "llama" else ():
        extra = ["--backend", "cuda"] + (["--max-device-bytes", a.cap] if cap else [])
        for sub, name, args in runs:
            label = f"{name} (cuda{', --max-device-bytes ' + cap if cap else ''})"
            cmd = [QUANTD, sub, *args, *extra]
            miss = missing_flags(sub, [f for f in extra if f.startswith("--")])
            if miss:
                noted(rows, label, cmd, "flag missing: " + ", ".join(miss))
                continue
            row = timed(rows, label, cmd, a.repeat, warm_up=a.warm_up)
            if "seconds" in row:
                row["vs_bound"] = row["seconds"] / bound
    why = llama_cuda(a.llama_bin)
    text = os.path.join(a.work, "text.txt")
    lout, lbase = os.path.join(a.work, "llama-imatrix.gguf"), os.path.join(a.work, "llama-base.kld")
    tool = lambda t: os.path.join(a.llama_bin, t)  # noqa: E731
    lruns = (("llama-imatrix -ngl 99", [tool("llama-imatrix"), "-m", model, "-f", text, "-c", a.ctx, "--chunks",
                                        a.chunks, "-ngl", "99", "-o", lout]),
             ("llama-perplexity --kl-divergence-base -ngl 99 (writes it)",
              [tool("llama-perplexity"), "-m", model, "-f", text, "-c", a.ctx, "--chunks", a.chunks, "-ngl", "99",
               "--kl-divergence-base", lbase]),
             ("llama-perplexity --kl-divergence -ngl 99",
              [tool("llama-perplexity"), "-m", model, "-c", a.ctx, "--chunks", a.chunks, "-ngl", "99",
               "--kl-divergence-base", lbase, "--kl-divergence"]))
    if a.only == "quantd":
        why = "left out (--only quantd)"
    if why:
        for name, cmd in lruns:
            noted(rows, name, cmd, why)
    else:
        text_of(model, text, n + 1)
        info["llama_text"] = text
        for name, cmd in lruns:
            row = timed(rows, name, cmd, a.llama_repeat)
            if "seconds" in row:
                row["vs_bound"] = row["seconds"] / bound
    secs = {r["case"]: r["seconds"] for r in rows if "seconds" in r}
    cap_label = f", --max-device-bytes {a.cap}"
    for (_, name, _), (lname, _) in zip(runs, lruns):
        ours = secs.get(f"{name} (cuda)")
        if ours and f"{name} (cuda{cap_label})" in secs:
            info.setdefault("capped_over_uncapped", {})[name] = secs[f"{name} (cuda{cap_label})"] / ours
        if ours and lname in secs:
            info.setdefault("llama_over_quantd", {})[name] = secs[lname] / ours
    if not a.keep:
        for f in (out, base, lout, lbase):
            if os.path.exists(f):
                os.unlink(f)


def cpu_mode(a, rows, info):
    if not a.model:
        raise SystemExit("--mode cpu needs --model GGUF (SmolLM2-135M-Instruct F16: make bench-model "
                         "BENCH_MODEL_MODE=cpu makes it)")
    model = a.model
    n = a.chunks * a.ctx
    text = a.text
    if not text:
        with open(os.path.join(ROOT, "tests", "fixtures", "model", "text.txt"), encoding="utf-8") as f:
            seed = f.read().rstrip("\n")
        text = text_of(model, os.path.join(a.work, "text-cpu.txt"), n + 1, seed_text=seed)
    info.update(model=model, model_bytes=os.path.getsize(model), text=text, tokens=n, cores="taskset -c 0,1")
    ts = ["taskset", "-c", "0,1"] if shutil.which("taskset") else []
    if not ts:
        info["note"] = "taskset is missing: the tools ran on every core, with -t 2"
    timed(rows, "cat model > /dev/null (page cache warm)", ["sh", "-c", f"cat '{model}' > /dev/null"], 1)
    backend = [] if missing_flags("imatrix", ["--backend"]) else ["--backend", "cpu"]
    common = ["-m", model, "-f", text, "-c", a.ctx, "--chunks", a.chunks, "-t", "2"]
    out, lout = os.path.join(a.work, "quantd-imatrix.gguf"), os.path.join(a.work, "llama-imatrix.gguf")
    pairs = (("imatrix", [QUANTD, "imatrix", *common, "-o", out, *backend],
              [os.path.join(a.llama_bin, "llama-imatrix"), *common, "-o", lout]),
             ("perplexity", [QUANTD, "perplexity", *common, *backend],
              [os.path.join(a.llama_bin, "llama-perplexity"), *common]))
    for what, ours, theirs in pairs:
        q = timed(rows, f"quantd {what} (2 cores)", [*ts, *ours], a.repeat)
        if not os.path.exists(theirs[0]):
            noted(rows, f"llama-{what} -t 2", [*ts, *theirs], "LLAMA_CPP_BIN is not set or lacks it")
            continue
        l_row = timed(rows, f"llama-{what} -t 2 (2 cores)", [*ts, *theirs], a.repeat)
        if "seconds" in q and "seconds" in l_row:
            q["llama_over_quantd"] = l_row["seconds"] / q["seconds"]
    if not a.keep:
        for f in (out, lout):
            if os.path.exists(f):
                os.unlink(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work")
    ap.add_argument("--mode", required=True, choices=["gpu", "cpu"])
    ap.add_argument("--size", default="8b", choices=sorted(bench_convert.SIZES), help="gpu: the model's shape")
    ap.add_argument("--model", help="cpu: the GGUF model")
    ap.add_argument("--text", help="cpu: the text (default: tests/fixtures/model/text.txt repeated)")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, help="default 100 (gpu), 10 (cpu)")
    ap.add_argument("--cap", default="4GiB", help="gpu: the capped runs' --max-device-bytes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-repeat", type=int, help="llama.cpp's runs (default 1 on the GPU, --repeat on the CPU)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs and base-logits files")
    ap.add_argument("--only", default="all", choices=["all", "quantd", "llama"], help="gpu: which tools run")
    ap.add_argument("--warm-up", type=int, default=1, help="gpu: quantd's untimed runs before each timed set")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.chunks = a.chunks or (100 if a.mode == "gpu" else 10)
    a.llama_repeat = a.llama_repeat or (1 if a.mode == "gpu" else a.repeat)
    a.llama_bin = os.environ.get("LLAMA_CPP_BIN", "")
    os.makedirs(a.work, exist_ok=True)
    rows, info = [], {"mode": a.mode, "n_ctx": a.ctx, "chunks": a.chunks, "repeat": a.repeat,
                      "llama_repeat": a.llama_repeat, "cpu_count": os.cpu_count(), "llama_cpp_bin": a.llama_bin}
    (gpu_mode if a.mode == "gpu" else cpu_mode)(a, rows, info)
    print(f"\n{a.mode}: {info['model']} ({info['model_bytes'] / 1e9:.2f} GB), {a.chunks} chunks of {a.ctx} "
          f"tokens, median of {a.repeat} (llama.cpp: {a.llama_repeat})")
    if "bound" in info:
        print(f"bound: {info['bound']['seconds']:.2f} s = {info['bound']['command']}")
    for key, what in (("capped_over_uncapped", f"capped ({a.cap}) over uncapped"),
                      ("llama_over_quantd", "llama.cpp's tool over quantd")):
        for name, x in info.get(key, {}).items():
            print(f"{what}: {name}: {x:.2f}x")
    print("| case | seconds | note | command |")
    print("|---|---|---|---|")
    for r in rows:
        sec = f"{r['seconds']:.2f}" if "seconds" in r else "-"
        note = r.get("note") or r.get("error", "")[:120]
        if "vs_bound" in r:
            note = f"{r['vs_bound']:.2f}x the bound"
        if "llama_over_quantd" in r:
            note = f"llama.cpp's tool takes {r['llama_over_quantd']:.2f}x as long"
        cmd = (r["command"] or "").replace("\n", "; ")
        print(f"| {r['case']} | {sec} | {note} | `{cmd[:240]}` |")
    path = a.json or os.path.join(a.work, "bench-model.json")
    with open(path, "w") as f:
        json.dump({**info, "rows": rows}, f, indent=1)
        f.write("\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
