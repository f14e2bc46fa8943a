"""What the bar charts of bench/plot_*.py share: a labelled bar and writing the file."""


def bar(svg, x, y, w, h, color, label, size):
    """A horizontal bar of width w at (x, y) and its value written after its end."""
    svg.append(f'<rect x="{x}" y="{y}" width="{w:.1f}" height="{h}" fill="{color}"/>')
    svg.append(f'<text x="{x + w + 3:.1f}" y="{y + size - 1}" font-size="{size}">{label}</text>')


def save(out, svg):
    with open(out, "w") as g:
        g.write("\n".join(svg + ["</svg>"]) + "\n")
