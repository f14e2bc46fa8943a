#!/usr/bin/env python3
"""SVG chart of bench_service's BENCH_JSON output for the large cases (QUANTD_BENCH_BIG with a
list of client counts): GB/s of request bodies against the number of clients, one line per
format and kind of client (the default N streams), beside the raw loopback TCP ceiling the
benchmark measured at each count, its half, and the same clients against the benchmark's null
server (nvfp4-sized answers): what these clients reach when the server does nothing.
usage: plot_service.py OUT.svg RESULT.json"""
import html
import json
import sys

from svgbars import save

W, H, L, T, B = 640, 360, 60, 40, 50  # size, left/top/bottom margins
COLORS = {"nvfp4": "#2b6cb0", "q8_0": "#2f855a", "nf4": "#b7791f"}


def main():
    out, f = sys.argv[1], sys.argv[2]
    every = json.load(open(f))["rows"]
    rows = [r for r in every if "N streams" in r["case"]]
    null = [r for r in every if r.get("null_server") and "nvfp4-sized" in r["case"]]
    counts = sorted({r["clients"] for r in rows})
    ceiling = {r["clients"]: r["loopback_gb_s"] for r in rows}
    top = max(ceiling.values()) * 1.1
    pw = W - L - 170

    def px(c):
        return L + (pw * counts.index(c) / max(1, len(counts) - 1))

    def py(v):
        return T + (H - T - B) * (1 - v / top)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           '<text x="10" y="16" font-size="13" font-weight="bold">quantd serve: GB/s of 64 MiB bf16 request bodies '
           'against clients</text>',
           f'<text x="10" y="30" font-size="10">{html.escape(sys.argv[2].split("/")[-1])}, drawn by bench/plot_service.py'
           '</text>']
    for k in range(6):  # the value axis
        v = top * k / 5
        svg.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{L + pw}" y2="{py(v):.1f}" stroke="#e2e8f0"/>'
                   f'<text x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.{0 if top > 20 else 1}f}</text>')
    for c in counts:
        svg.append(f'<text x="{px(c):.1f}" y="{H - B + 16}" text-anchor="middle">{c}</text>')
    svg.append(f'<text x="{L + pw / 2}" y="{H - 14}" text-anchor="middle">clients</text>'
               f'<text x="14" y="{T + (H - T - B) / 2}" transform="rotate(-90 14 {T + (H - T - B) / 2})" '
               f'text-anchor="middle">GB/s</text>')
    lines = [("loopback TCP", [(c, ceiling[c]) for c in counts], "#718096", ""),
             ("half of it", [(c, ceiling[c] / 2) for c in counts], "#e53e3e", ' stroke-dasharray="4,3"')]
    for curl in (0, 1):
        pts = sorted((r["clients"], r["mb_s_in"] / 1e3) for r in null if r["curl_like"] == curl)
        if pts:
            lines.append((f"null server, {'curl-like' if curl else 'lean'}", pts, "#a0aec0",
                          ' stroke-dasharray="2,2"' if curl else ""))
    for fmt in COLORS:
        for curl in (0, 1):
            pts = [(r["clients"], r["mb_s_in"] / 1e3) for r in rows
                   if f", {fmt}," in r["case"] and r["curl_like"] == curl]
            if pts:
                lines.append((f"{fmt}, {'curl-like' if curl else 'lean'}", sorted(pts), COLORS[fmt],
                              ' stroke-dasharray="2,2"' if curl else ""))
    for k, (label, pts, color, dash) in enumerate(lines):
        d = " ".join(f"{px(c):.1f},{py(v):.1f}" for c, v in pts)
        svg.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for c, v in pts:
            svg.append(f'<circle cx="{px(c):.1f}" cy="{py(v):.1f}" r="2.5" fill="{color}"/>')
        ly = T + 14 * k
        svg.append(f'<line x1="{L + pw + 14}" y1="{ly}" x2="{L + pw + 34}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2"{dash}/><text x="{L + pw + 38}" y="{ly + 4}">{html.escape(label)}</text>')
    save(out, svg)


if __name__ == "__main__":
    main()
