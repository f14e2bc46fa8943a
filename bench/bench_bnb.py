"""bitsandbytes quantize_4bit / dequantize_4bit (nf4, fp4, blocksize 64, compress_statistics on)
on the same shapes as bench_gpu (bf16 4096^2, 8192^2, 16384^2), timed the same way (median of
15 runs between CUDA events), with the device-to-device copy bandwidth measured in the same
process. Run on the GPU machine next to bench_gpu: make bench-gpu. BENCH_JSON=FILE also writes
the rows (bench/plot_bnb.py draws them beside bench_gpu's)."""
import json
import os
import torch
import bitsandbytes.functional as F

RUNS = 15


def median_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    times = []
    for _ in range(RUNS):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[RUNS // 2]


def nbytes(t):
    return t.numel() * t.element_size()


rows = []
print(f"# bitsandbytes {__import__('bitsandbytes').__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
print("| bitsandbytes | shape | quantize ms | GB/s | % copy | dequantize ms | GB/s | % copy |")
print("|---|---|---|---|---|---|---|---|")
for side in (4096, 8192, 16384):
    x = torch.randn(side, side, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    copy_ms = median_ms(lambda: y.copy_(x))
    copy_gbs = 2 * nbytes(x) / (copy_ms * 1e6)
    for qt in ("nf4", "fp4"):
        q, st = F.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type=qt)
        out_bytes = nbytes(q) + nbytes(st.absmax) + nbytes(st.state2.absmax)
        q_ms = median_ms(lambda: F.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type=qt))
        d_ms = median_ms(lambda: F.dequantize_4bit(q, st))
        qg, dg = (nbytes(x) + out_bytes) / (q_ms * 1e6), (nbytes(x) + out_bytes) / (d_ms * 1e6)
        print(f"| {qt} bs64 dq | {side}x{side} | {q_ms:.3f} | {qg:.0f} | {100 * qg / copy_gbs:.0f} % "
              f"| {d_ms:.3f} | {dg:.0f} | {100 * dg / copy_gbs:.0f} % |")
        rows.append(dict(fmt=qt, params="bs64 dq", side=side, quantize_ms=round(q_ms, 4), dequantize_ms=round(d_ms, 4),
                         copy_gbs=round(copy_gbs, 1)))
if os.environ.get("BENCH_JSON"):
    with open(os.environ["BENCH_JSON"], "w") as f:
        json.dump(dict(library="bitsandbytes " + __import__("bitsandbytes").__version__, torch=torch.__version__,
                       device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
