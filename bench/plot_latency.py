#!/usr/bin/env python3
"""SVG plot of bench_latency.py --json results: p50 and p99 latency against the achieved rate,
one line pair per format. usage: plot_latency.py OUT.svg RESULT.json"""
import html
import json
import sys

W, H, L, B, T, R = 640, 360, 60, 50, 40, 150
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def main():
    out, src = sys.argv[1], sys.argv[2]
    d = json.load(open(src))
    series = {}
    for r in d["runs"]:
        series.setdefault(r["what"], []).append((r["rps"], r["p50_ms"], r["p99_ms"]))
    xmax = max(x for pts in series.values() for x, _, _ in pts) * 1.1
    ymax = max(y for pts in series.values() for _, _, y in pts) * 1.15

    def px(x):
        return L + (W - L - R) * x / xmax

    def py(y):
        return H - B - (H - B - T) * y / ymax

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="20" font-size="14" font-weight="bold">quantd latency, {html.escape(d["body"])}, '
           f'{d["connections"]} connections, {d["backend"]} backend, {d["cores"]} cores</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">achieved requests/s</text>',
           f'<text x="14" y="{(T + H - B) / 2}" transform="rotate(-90 14 {(T + H - B) / 2})" '
           f'text-anchor="middle">latency, ms (solid p50, dashed p99)</text>']
    for i in range(6):
        x, y = xmax * i / 5, ymax * i / 5
        svg.append(f'<text x="{px(x):.0f}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
        svg.append(f'<text x="{L - 6}" y="{py(y) + 4:.0f}" text-anchor="end">{y:.1f}</text>')
        svg.append(f'<line x1="{L}" y1="{py(y):.1f}" x2="{W - R}" y2="{py(y):.1f}" stroke="#ddd"/>')
    for k, (name, pts) in enumerate(series.items()):
        pts.sort()
        c = COLORS[k % len(COLORS)]
        for idx, dash in ((1, ""), (2, ' stroke-dasharray="5,4"')):
            path = " ".join(f"{px(p[0]):.1f},{py(p[idx]):.1f}" for p in pts)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
            for p in pts:
                svg.append(f'<circle cx="{px(p[0]):.1f}" cy="{py(p[idx]):.1f}" r="3" fill="{c}"/>')
        svg.append(f'<text x="{W - R + 10}" y="{T + 18 * k + 10}" fill="{c}">{html.escape(name)}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
