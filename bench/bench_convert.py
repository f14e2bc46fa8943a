#!/usr/bin/env python3
"""make bench-convert: whole-model conversion against merely reading the files.

usage: bench_convert.py WORKDIR [--size 8b|1b|300m|tiny] [--only hf|gguf] [--json OUT]

hf:   a Llama-shaped bf16 checkpoint of random weights in 5 GB shards (transformers builds it,
      on the GPU when there is one); times `cat` of its shards into /dev/null (page cache warm),
      `quantd convert --fmt nf4` (transformers + bitsandbytes), `--fmt w4a16`, `w8a16`, `nvfp4`
      and `mxfp4` (compressed-tensors) and `--fmt awq` (AutoAWQ) on each backend, and, where bitsandbytes and a GPU are there,
      transformers' from_pretrained(BitsAndBytesConfig nf4, double quant) + save_pretrained;
      `--fmt mlx_affine` (bits 4, group 64) and `mlx_mxfp4` (mlx-lm's layout; a tiny tokenizer is
      added to the source, which mlx-lm needs) and, where mlx-lm is installed, `mlx_lm.convert -q`
      (`--q-mode affine` / `mxfp4`) on the same machine's CPU (mlx[cpu]).
gguf: the same shapes as a BF16 GGUF (written with the gguf package); times `cat`, `quantd
      convert --fmt q4_0`, `--fmt q8_0` and `--recipe Q4_K_M`, the durable-write bound of each
      output (its size written as quantd writes it: bench/write_bound.py) and its copy bound (the
      same writes while reading the whole input), and llama-quantize
      (LLAMA_CPP_BIN) on all cores for the same three (`--pure Q4_0`, `--pure Q8_0`, `Q4_K_M`).
fp8_bf16: quantd writes the model as FineGrainedFP8 (DeepSeek-V3's layout), then times `quantd
      convert --fmt bf16` of that back to bf16 against `cat` of the FP8 shards and `dd` writing
      the output's size durably (buffered + fsync, and O_DIRECT).
--targets picks some of nf4 w4a16 w8a16 nvfp4 mxfp4 awq transformers mlx_affine mlx_mxfp4 mlx_lm
fp8_bf16 q4_0 q8_0 Q4_K_M, or any other quantd format (lower case: --fmt, llama-quantize --pure) or
llama-quantize mix (upper case: --recipe) such as IQ4_XS (default all but the MLX and FP8 ones);
--imatrix gives both tools a synthetic importance matrix (tests/checkpoint/tiny_imatrix.py);
--devices 0,1 passes --devices to the CUDA runs (one run per device list: the scaling over GPUs).
Every figure is the median of REPEAT runs (default 3) after one warm-up (llama-quantize: none,
the runs before it have warmed the page cache; LQ_REPEAT sets its run count), each run after a sync
(no dirty pages left by the one before), with the process's peak RSS (quantd's own VmHWM;
wait4's for the others)."""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "checkpoint"))
import tiny_hf  # noqa: E402 (write_tokenizer: mlx-lm needs a tokenizer beside the model)
import write_bound  # noqa: E402 (bench/: the durable-write bound of an output)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUANTD = os.environ.get("QUANTD", os.path.join(ROOT, "bin", "quantd"))
SIZES = {  # hidden, ffn, layers, heads, kv heads, vocab
    "8b": (4096, 14336, 32, 32, 8, 128256),
    "1b": (2048, 5632, 22, 32, 4, 32000),
    "300m": (1024, 2816, 8, 16, 8, 32000),  # ~160M parameters: the slow IQ mixes on 2 cores
    "tiny": (256, 768, 3, 4, 2, 320),
}


def run(cmd, env=None):
    """Wall seconds and peak RSS (bytes) of one process."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    last = out.decode(errors="replace").strip().splitlines()[-1:] or [""]
    if last[0].startswith('{"summary"'):
        return wall, json.loads(last[0])["summary"]["peak_rss_bytes"]
    err = p.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(map(str, cmd))} failed: {err[-2000:]}")
    # ru_maxrss also counts the pre-exec copy of this (forked) process; quantd reports its own
    return wall, usage.ru_maxrss * 1024


def timed(name, cmd, repeat, cleanup=None, env=None, warm_up=True):
    if warm_up:
        run(cmd, env)  # warm-up: page cache, the CUDA context's first start
    walls, rss = [], 0
    for _ in range(repeat):
        if cleanup:
            cleanup()
        # every run starts with no dirty pages: else one run pays the writeback of the last
        # one's output (quantd fsyncs its output before the rename; llama-quantize does not)
        os.sync()
        w, r = run(cmd, env)
        walls.append(w)
        rss = max(rss, r)
    row = {"case": name, "seconds": statistics.median(walls), "min": min(walls), "max": max(walls),
           "peak_rss_bytes": rss}
    print(f"# {name}: {row['seconds']:.2f} s (runs {', '.join(f'{w:.2f}' for w in walls)})", flush=True)
    return row


def make_hf(d, size):
    if os.path.exists(os.path.join(d, "config.json")):
        return
    h, ffn, layers, heads, kv, vocab = SIZES[size]
    code = f"""
import torch, transformers
cfg = transformers.LlamaConfig(hidden_size={h}, intermediate_size={ffn}, num_hidden_layers={layers},
    num_attention_heads={heads}, num_key_value_heads={kv}, vocab_size={vocab}, tie_word_embeddings=False)
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.set_default_dtype(torch.bfloat16)
with torch.device(dev):
    m = transformers.LlamaForCausalLM(cfg)
m.save_pretrained({d!r}, max_shard_size="5GB")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def make_gguf(path, size, extra=()):
    """The SIZES[size]-shaped BF16 GGUF (tests/checkpoint/tiny_gguf.py; `extra`: more of its arguments)."""
    if os.path.exists(path):
        return
    h, ffn, layers, heads, kv, vocab = SIZES[size]
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", "tiny_gguf.py"), path, "bf16",
                    "--hidden", str(h), "--ffn", str(ffn), "--layers", str(layers), "--heads", str(heads),
                    "--kv-heads", str(kv), "--vocab", str(vocab), *extra], check=True)


def devices_args(backend, devices):
    return ["--devices", devices] if backend == "cuda" and devices else []


def backend_label(backend, devices):
    return f"{backend}, devices {devices}" if backend == "cuda" and devices else backend


def gb(b):
    return b / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--size", default="8b", choices=sorted(SIZES))
    ap.add_argument("--only", choices=["hf", "gguf"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--targets", default="nf4,w4a16,w8a16,nvfp4,mxfp4,awq,transformers,q4_0,q8_0,Q4_K_M")
    ap.add_argument("--backends", default="cpu,cuda", help="quantd backends to time (cuda only with a GPU)")
    ap.add_argument("--imatrix", action="store_true",
                    help="gguf: both tools quantize with a synthetic importance matrix (tests/checkpoint/tiny_imatrix.py)")
    ap.add_argument("--devices", help="the CUDA runs' --devices (e.g. 0,1: the scaling over GPUs)")
    a = ap.parse_args()
    targets = a.targets.split(",")
    os.makedirs(a.work, exist_ok=True)
    rows = []
    backends = [b for b in a.backends.split(",") if b == "cpu"]
    # asked in a child: torch loaded here would count in every child's peak RSS (fork copies it)
    gpu = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True).stdout.strip() == "True"
    if gpu and "cuda" in a.backends.split(","):
        backends.append("cuda")
    if a.only != "gguf":
        src = os.path.join(a.work, f"hf-{a.size}")
        make_hf(src, a.size)
        shards = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
        size = sum(os.path.getsize(f) for f in shards)
        rows.append(dict(timed("hf: cat shards > /dev/null", ["sh", "-c", "cat \"$@\" > /dev/null", "cat", *shards],
                               a.repeat), bytes=size))
        out = os.path.join(a.work, "hf-out")
        for fmt in (t for t in ("nf4", "w4a16", "w8a16", "nvfp4", "mxfp4", "awq") if t in targets):
            for b in backends:
                rows.append(dict(timed(f"hf: quantd convert {fmt} ({backend_label(b, a.devices)})",
                                       [QUANTD, "convert", "--in", src, "--out", out, "--fmt", fmt, "--backend", b,
                                        *devices_args(b, a.devices)],
                                       a.repeat, cleanup=lambda: shutil.rmtree(out, ignore_errors=True)), bytes=size))
                shutil.rmtree(out, ignore_errors=True)
        mlx = [t for t in ("mlx_affine", "mlx_mxfp4") if t in targets]
        if mlx and not os.path.exists(os.path.join(src, "tokenizer.json")):
            tiny_hf.write_tokenizer(src, SIZES[a.size][5])
        for fmt in mlx:
            for b in backends:
                rows.append(dict(timed(f"hf: quantd convert {fmt} ({backend_label(b, a.devices)})",
                                       [QUANTD, "convert", "--in", src, "--out", out, "--fmt", fmt, "--backend", b,
                                        *devices_args(b, a.devices)],
                                       a.repeat, cleanup=lambda: shutil.rmtree(out, ignore_errors=True)), bytes=size))
                shutil.rmtree(out, ignore_errors=True)
            if "mlx_lm" in targets and importlib.util.find_spec("mlx_lm"):
                mode = fmt.split("_", 1)[1]
                rows.append(dict(timed(f"hf: mlx_lm.convert -q --q-mode {mode} (CPU, {os.cpu_count()} cores)",
                                       [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", src, "--mlx-path", out,
                                        "-q", "--q-mode", mode], int(os.environ.get("MLX_REPEAT", a.repeat)),
                                       cleanup=lambda: shutil.rmtree(out, ignore_errors=True), warm_up=False),
                                 bytes=size))
                shutil.rmtree(out, ignore_errors=True)
        if "fp8_bf16" in targets:
            # FP8 -> bf16: a FineGrainedFP8 checkpoint (DeepSeek-V3's layout, written by quantd
            # from the bf16 model) back to bf16, against reading it and against writing its
            # output durably (dd: buffered + fsync, and O_DIRECT), whichever bounds it
            fp8 = os.path.join(a.work, f"hf-{a.size}-fp8")
            if not os.path.exists(os.path.join(fp8, "config.json")):
                subprocess.run([QUANTD, "convert", "--in", src, "--out", fp8, "--fmt", "fp8_e4m3", "--param",
                                "flow=transformers", "--backend", backends[-1]], check=True, stdout=subprocess.DEVNULL)
            fshards = sorted(os.path.join(fp8, f) for f in os.listdir(fp8) if f.endswith(".safetensors"))
            fsize = sum(os.path.getsize(f) for f in fshards)
            rows.append(dict(timed("hf fp8: cat shards > /dev/null", ["sh", "-c", "cat \"$@\" > /dev/null", "cat",
                                                                       *fshards], a.repeat), bytes=fsize))
            blocks = (size + (16 << 20) - 1) >> 24  # the bf16 output is the source's size
            sink = os.path.join(a.work, "dd.out")
            for flag, label in (("conv=fsync", "buffered + fsync"), ("oflag=direct", "O_DIRECT")):
                rows.append(dict(timed(f"hf fp8: dd {gb(blocks << 24):.2f} GB ({label})",
                                       ["dd", "if=/dev/zero", f"of={sink}", "bs=16M", f"count={blocks}", flag,
                                        "status=none"], a.repeat, cleanup=lambda: os.path.exists(sink) and
                                       os.unlink(sink)), bytes=fsize))
            if os.path.exists(sink):
                os.unlink(sink)
            for b in backends:
                rows.append(dict(timed(f"hf fp8: quantd convert --fmt bf16 ({backend_label(b, a.devices)})",
                                       [QUANTD, "convert", "--in", fp8, "--out", out, "--fmt", "bf16", "--backend", b,
                                        *devices_args(b, a.devices)],
                                       a.repeat, cleanup=lambda: shutil.rmtree(out, ignore_errors=True)),
                                 bytes=fsize))
                shutil.rmtree(out, ignore_errors=True)
        if "cuda" in backends and "transformers" in targets:
            if importlib.util.find_spec("bitsandbytes"):
                code = f"""
import torch, transformers
cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
m = transformers.AutoModelForCausalLM.from_pretrained({src!r}, quantization_config=cfg, device_map="cuda",
    dtype=torch.bfloat16)
m.save_pretrained({out!r})
"""
                rows.append(dict(timed("hf: transformers from_pretrained(nf4) + save_pretrained",
                                       [sys.executable, "-c", code], a.repeat,
                                       cleanup=lambda: shutil.rmtree(out, ignore_errors=True)), bytes=size))
                shutil.rmtree(out, ignore_errors=True)
    if a.only != "hf":
        src = os.path.join(a.work, f"{a.size}-bf16.gguf")
        make_gguf(src, a.size)
        size = os.path.getsize(src)
        rows.append(dict(timed("gguf: cat > /dev/null", ["sh", "-c", f"cat '{src}' > /dev/null"], a.repeat), bytes=size))
        out = os.path.join(a.work, "out.gguf")

        def drop_out():
            # each run writes a new file: replacing the last run's output is not the conversion
            # (it added 1.2-1.5 s to an 8B Q4_K_M run on the H200 machine's disk)
            if os.path.exists(out):
                os.unlink(out)
        imx = []
        if a.imatrix:  # a synthetic importance matrix over the model's weights, both tools given it
            imx_path = os.path.join(a.work, f"{a.size}.imatrix.gguf")
            if not os.path.exists(imx_path):
                subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", "tiny_imatrix.py"), src,
                                imx_path, "gguf"], check=True)
            imx = ["--imatrix", imx_path]
        hf_targets = ("nf4", "w4a16", "w8a16", "nvfp4", "mxfp4", "awq", "transformers", "mlx_affine", "mlx_mxfp4",
                      "mlx_lm", "fp8_bf16")
        for t in (t for t in targets if t not in hf_targets):
            pure = t.islower()  # a format: --fmt / --pure; a mix: --recipe / llama-quantize's rules
            for b in backends:
                rows.append(dict(timed(f"gguf: quantd convert {'--fmt' if pure else '--recipe'} {t}{' --imatrix' * bool(imx)} "
                                       f"({backend_label(b, a.devices)})",
                                       [QUANTD, "convert", "--in", src, "--out", out, "--fmt" if pure else "--recipe",
                                        t, "--force", "--backend", b, *imx, *devices_args(b, a.devices)], a.repeat,
                                       cleanup=drop_out),
                            bytes=size))
            if os.path.exists(out):  # the bound: this output's size written as quantd writes it
                osize = os.path.getsize(out)
                # alone, and while reading the whole input (the copy bound: no work between)
                for read, what in ((None, "write bound"), (src, "copy bound")):
                    walls = []
                    for _ in range(a.repeat):
                        os.sync()
                        walls.append(write_bound.measure(out + ".bound", osize, write_bound.default_writers(), read))
                    rows.append({"case": f"gguf: {what} of {t}'s output, {gb(osize):.2f} GB "
                                         f"({write_bound.default_writers()} O_DIRECT writers + fsync"
                                         f"{', reading the input' if read else ''})",
                                 "seconds": statistics.median(walls), "min": min(walls), "max": max(walls),
                                 "peak_rss_bytes": 0, "bytes": size})
                    print(f"# {rows[-1]['case']}: {rows[-1]['seconds']:.2f} s", flush=True)
            lq = os.path.join(os.environ.get("LLAMA_CPP_BIN", ""), "llama-quantize")
            if os.path.exists(lq):
                lq_args = ["--pure"] if pure else []
                rows.append(dict(timed(f"gguf: llama-quantize {' '.join(lq_args + imx[:1] + [t.upper()])} "
                                       f"({os.cpu_count()} threads)",
                                       [lq, *lq_args, *imx, src, out, t.upper(), str(os.cpu_count())],
                                       int(os.environ.get("LQ_REPEAT", a.repeat)), cleanup=drop_out, warm_up=False),
                            bytes=size))
        drop_out()
    print(f"\n{a.size}-shaped model, median of {a.repeat} (after a warm-up), {os.cpu_count()} cores")
    print("| case | input GB | seconds (min-max) | GB/s of input | peak RSS GB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {gb(r['bytes']):.2f} | {r['seconds']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | "
              f"{gb(r['bytes']) / r['seconds']:.2f} | {gb(r['peak_rss_bytes']):.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"size": a.size, "cores": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
