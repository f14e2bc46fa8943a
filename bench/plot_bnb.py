#!/usr/bin/env python3
"""SVG chart of quantd against bitsandbytes on the same GPU: nf4 and fp4 (blocksize 64, double
quant) quantize and dequantize of bf16 tensors, ms per call for each shape both measured, from
bench_gpu's BENCH_JSON output (one or more files) and bench_bnb.py's.
usage: plot_bnb.py OUT.svg BNB.json QUANTD.json [QUANTD.json ...]"""
import html
import json
import sys

from svgbars import bar, save

BAR_H, GAP, LEFT, PANEL, PAD = 9, 10, 150, 300, 70
COLORS = ("#2b6cb0", "#a0aec0")  # quantd, bitsandbytes


def main():
    out, bnb_file, quantd_files = sys.argv[1], sys.argv[2], sys.argv[3:]
    bnb = json.load(open(bnb_file))
    ours = {}
    for f in quantd_files:
        for r in json.load(open(f))["rows"]:
            if r["params"] == "bs64 dq":
                ours[(r["fmt"], r["side"])] = r
    keys = [(r["fmt"], r["side"]) for r in bnb["rows"] if (r["fmt"], r["side"]) in ours]
    theirs = {(r["fmt"], r["side"]): r for r in bnb["rows"]}
    height = 70 + len(keys) * (2 * BAR_H + GAP) + 20
    width = LEFT + 2 * (PANEL + PAD) + 10
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">',
           f'<text x="10" y="16" font-size="13" font-weight="bold">quantd against {html.escape(bnb["library"])}, '
           f'ms per call (shorter is better), {html.escape(bnb["device"])}</text>',
           f'<text x="10" y="30" font-size="10">bf16 input, blocksize 64, double quant; drawn by bench/plot_bnb.py'
           f'</text>']
    for k, name in enumerate(("quantd", "bitsandbytes")):
        svg.append(f'<rect x="{10 + 110 * k}" y="38" width="10" height="9" fill="{COLORS[k]}"/>'
                   f'<text x="{24 + 110 * k}" y="46">{name}</text>')
    for p, what in enumerate(("quantize", "dequantize")):
        x0 = LEFT + p * (PANEL + PAD)
        top = max(max(ours[k][f"{what}_ms"], theirs[k][f"{what}_ms"]) for k in keys) * 1.05
        svg.append(f'<text x="{x0}" y="62" font-weight="bold">{what}</text>')
        y = 68
        for key in keys:
            fmt, side = key
            if p == 0:
                svg.append(f'<text x="{LEFT - 6}" y="{y + BAR_H + 4}" text-anchor="end">{fmt} {side}x{side}</text>')
            q, b = ours[key][f"{what}_ms"], theirs[key][f"{what}_ms"]
            bar(svg, x0, y, PANEL * q / top, BAR_H, COLORS[0], f"{q:.3f} ms ({b / q:.1f}x faster)", 9)
            bar(svg, x0, y + BAR_H, PANEL * b / top, BAR_H, COLORS[1], f"{b:.3f} ms", 9)
            y += 2 * BAR_H + GAP
    save(out, svg)


if __name__ == "__main__":
    main()
