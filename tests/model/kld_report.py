"""llama-perplexity --kl-divergence's printed statistics as figures (fractions, as quantd's JSON
summary names them), for the fixtures (tests/fixtures/make_kld_fixtures.py) and the checks
(tests/peers/test_model_kld.py, tests/consumers/test_llama_cpp_kld.py)."""
import re

NUM = r"(-?[0-9.]+|nan|-?inf)"
PCT = {"Maximum": "max", "99.9%": "p99_9", "99.0%": "p99", "95.0%": "p95", "90.0%": "p90", "75.0%": "p75",
       "Median": "median", "25.0%": "p25", "10.0%": "p10", "5.0%": "p5", "1.0%": "p1", "0.1%": "p0_1",
       "Minimum": "min"}


def parse(text):
    """{"ppl": {...}, "kld": {...}, "delta_p": {...}, "same_top_p": x, "same_top_p_error": y,
    "chunks": [line, ...]} from llama-perplexity's (or quantd's) printed KL divergence report;
    None when the final statistics are missing or cut short (llama.cpp's log thread sometimes drops
    an exiting process's last lines)."""
    try:
        return _parse(text)
    except (AttributeError, TypeError):  # a section missing: a regex found nothing
        return None


def _parse(text):
    out = {"ppl": {}, "kld": {}, "delta_p": {}}

    def pair(label):
        m = re.search(re.escape(label) + r"\s*:\s*" + NUM + r"\s*±\s*" + NUM, text)
        return (float(m.group(1)), float(m.group(2))) if m else None

    for label, key in (("Mean PPL(Q)", "q"), ("Mean PPL(base)", "base"), ("Mean ln(PPL(Q)/PPL(base))", "ln_ratio"),
                       ("Mean PPL(Q)/PPL(base)", "ratio"), ("Mean PPL(Q)-PPL(base)", "diff")):
        v = pair(label)
        if v is None:
            return None
        out["ppl"][key], out["ppl"][key + "_error"] = v
    m = re.search(r"Cor\(ln\(PPL\(Q\)\), ln\(PPL\(base\)\)\):\s*" + NUM + "%", text)
    out["ppl"]["correlation"] = float(m.group(1)) / 100
    v = pair("Mean    KLD")
    out["kld"]["mean"], out["kld"]["mean_error"] = v
    for m in re.finditer(r"^\s*(\S+)\s+KLD:\s*" + NUM + r"\s*$", text, re.M):
        if m.group(1) in PCT:
            out["kld"][PCT[m.group(1)]] = float(m.group(2))
    m = re.search(r"Mean    Δp:\s*" + NUM + r"\s*±\s*" + NUM + " %", text)
    out["delta_p"]["mean"], out["delta_p"]["mean_error"] = float(m.group(1)) / 100, float(m.group(2)) / 100
    for m in re.finditer(r"^\s*(\S+)\s+Δp:\s*" + NUM + r"%\s*$", text, re.M):
        if m.group(1) in PCT:
            out["delta_p"][PCT[m.group(1)]] = float(m.group(2)) / 100
    m = re.search(r"RMS Δp\s*:\s*" + NUM + r"\s*±\s*" + NUM + " %", text)
    out["delta_p"]["rms"], out["delta_p"]["rms_error"] = float(m.group(1)) / 100, float(m.group(2)) / 100
    m = re.search(r"Same top p:\s*" + NUM + r"\s*±\s*" + NUM + " %", text)
    if not m:
        return None
    out["same_top_p"], out["same_top_p_error"] = float(m.group(1)) / 100, float(m.group(2)) / 100
    out["chunks"] = [line for line in text.splitlines() if re.match(r"^\s*\d+\s+[0-9.]+ ±", line)]
    return out
