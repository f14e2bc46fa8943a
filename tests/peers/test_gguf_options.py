"""llama-quantize's options in quantd convert: for each case of tests/fixtures/gguf_options
(made by tests/fixtures/make_gguf_option_fixtures.py with llama-quantize itself), quantd writes
the same file, byte for byte, from the same input with the same options; --dry-run names the
types and the size of that file; numeric ids and any case name the mixes and types; bad
option values are refused with a message naming the option."""
import hashlib
import json
import os
import subprocess
import sys

import gguf
import pytest

from conftest import FIXTURES, ROOT, run_quantd

with open(os.path.join(FIXTURES, "gguf_options", "llama_quantize.json")) as f:
    FIX = json.load(f)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("opt")
    made = {}
    for name, (script, *args) in FIX["models"].items():
        made[name] = d / f"{name}.gguf"
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", script), str(made[name]), *args],
                       check=True)
        assert sha256(made[name]) == FIX["inputs"][name], \
            f"{name}: the gguf package writes another input than the fixtures were made from: remake them"
    for name, (model, mix) in FIX["quantized"].items():  # llama-quantize's own, which quantd writes byte for byte
        made[name] = d / f"{name}.gguf"
        run_quantd("convert", "--in", made[model], "--out", made[name], "--recipe", mix)
        assert sha256(made[name]) == FIX["inputs"][name], f"{name}: not llama-quantize's file"
    for name, (model, kind) in FIX["imatrices"].items():
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "checkpoint", "tiny_imatrix.py"), str(made[model]),
                        str(d / name), kind], check=True)
        assert sha256(d / name) == FIX["inputs"][name], f"{name}: another imatrix than the fixtures': remake them"
    types = d / "types.txt"
    types.write_text(FIX["types_file"])
    made["TYPES_FILE"] = types
    made["DIR"] = d
    return made


def options(models, case):
    return [str(models["TYPES_FILE"]) if a == "TYPES_FILE" else a for a in case["options"]]


def types_of(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("key", sorted(FIX["cases"]))
def test_option_equals_llama_quantize(models, tmp_path, key):
    case = FIX["cases"][key]
    out = tmp_path / "out.gguf"
    # in the models' directory: an imatrix is named relative to it, as the file records it
    from conftest import QUANTD
    p = subprocess.run([QUANTD, "convert", "--in", models[case["model"]], "--out", out, *options(models, case),
                        "--recipe", case["mix"]], capture_output=True, text=True, cwd=models["DIR"])
    assert p.returncode == 0, p.stderr
    if sha256(out) != case["sha256"]:
        ours = types_of(out)
        differ = sorted(n for n in case["types"] if ours.get(n) != case["types"][n])
        raise AssertionError(f"{key}: the file differs from llama-quantize's ({os.path.getsize(out)} vs "
                             f"{case['bytes']} bytes); types that differ: " +
                             ", ".join(f"{n} {ours.get(n)} vs {case['types'][n]}" for n in differ[:6]))


def test_dry_run_names_types_and_size(models, tmp_path):
    """Each tensor's type and the size of the file llama-quantize writes, and no file."""
    for key in ("tensor_type", "prune_layers", "output_type_tied"):
        case = FIX["cases"][key]
        p = run_quantd("convert", "--in", models[case["model"]], "--dry-run", *options(models, case),
                       "--recipe", case["mix"])
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        summary = lines[-1]["summary"]
        assert summary["dry_run"] is True and summary["bytes_out"] == case["bytes"], (key, summary)
        types = {l["name"]: l["fmt"] for l in lines[:-1]}
        for name, t in case["types"].items():
            want = t.lower()
            if types[name] == "copied":  # a tensor left in its own type
                continue
            assert types[name].lower() == want, (key, name, types[name], t)
    out = tmp_path / "never.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", out, "--dry-run", "--recipe", "Q4_0")
    assert not out.exists()


@pytest.mark.parametrize("spelling", ["15", "q4_k_m", "Q4_k_M"])
def test_mix_by_number_or_any_case(models, tmp_path, spelling):
    """llama-quantize's numeric ids (15: Q4_K_M) and names in any case name the mix; the file is
    the one llama-quantize writes for Q4_K_M with --leave-output-tensor."""
    case = FIX["cases"]["leave_output"]
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", out, "--leave-output-tensor", "--recipe", spelling)
    assert sha256(out) == case["sha256"]


def test_fmt_number_is_pure_mix(models, tmp_path):
    """--fmt 11 is llama-quantize --pure 11 (Q3_K_S): its file type, every tensor q3_K."""
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", out, "--fmt", "11")
    assert sha256(out) == FIX["cases"]["pure_q3_k_s"]["sha256"]


def test_written_type_in_each_line(models, tmp_path):
    """The per-tensor line names the type written: Q4_K_M's output.weight is q6_K."""
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "Q4_K_M")
    lines = {l["name"]: l["fmt"] for l in map(json.loads, p.stdout.splitlines()[:-1])}
    assert lines["output.weight"] == "q6_K" and lines["blk.0.attn_q.weight"] == "q4_K"


@pytest.mark.parametrize("args,says", [
    (["--tensor-type", "attn_v"], "--tensor-type: 'attn_v' has no '='"),
    (["--tensor-type", "=q8_0"], "has no tensor name"),
    (["--tensor-type", "attn_v=q9_9"], "'q9_9' in 'attn_v=q9_9' is not a ggml type"),
    (["--tensor-type", "(?:attn)=q8_0"], "(?...) groups"),
    (["--tensor-type", "attn(=q8_0"], "--tensor-type 'attn('"),
    (["--output-tensor-type", "q3"], "--output-tensor-type: 'q3' is not a ggml type"),
    (["--override-kv", "general.name"], "has no key"),
    (["--override-kv", "a=int:x"], "'x' is not an integer"),
    (["--override-kv", "a=bool:yes"], "a bool is true or false"),
    (["--override-kv", "a=list:1"], "has no type"),
    (["--prune-layers", "1,-2"], "--prune-layers: invalid layer id"),
    (["--tensor-type-file", "/nonexistent/types.txt"], "--tensor-type-file: cannot open"),
    (["--output-tensor-type", "q1_0"], "quantd does not write ggml type q1_0"),
])
def test_bad_option_is_refused(models, tmp_path, args, says):
    out = tmp_path / "out.gguf"
    p = run_quantd("convert", "--in", models["llama"], "--out", out, *args, "--recipe", "Q4_K_M", check=False)
    assert p.returncode in (1, 2) and says in p.stderr, p.stderr
    assert not out.exists()


@pytest.mark.parametrize("mix,tensor_type", [("IQ1_S", "iq1_s"), ("iq1_m", "iq1_m"), ("IQ3_XXS", "iq2_s"),
                                             ("IQ3_XS", "iq3_xxs")])
def test_imatrix_mix_needs_imatrix(models, tmp_path, mix, tensor_type):
    """The mixes whose tensors llama-quantize writes only with an importance matrix are refused
    without one, naming the first such tensor and its type as llama-quantize does (its
    "offending tensor: blk.0.attn_k.weight, target type: ..."), and the fix; no file."""
    out = tmp_path / "out.gguf"
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--recipe", mix, check=False)
    assert p.returncode == 1, p.stderr
    assert "requires an importance matrix (--imatrix FILE" in p.stderr, p.stderr
    assert f"tensor 'blk.0.attn_k.weight' would be {tensor_type}" in p.stderr, p.stderr
    assert not out.exists()


def test_option_value_missing(models, tmp_path):
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "Q4_0",
                   "--token-embedding-type", check=False)
    assert p.returncode == 2 and "--token-embedding-type needs a value" in p.stderr, p.stderr


def test_requantize_needs_the_option(models, tmp_path):
    p = run_quantd("convert", "--in", models["llama-q8_0"], "--out", tmp_path / "o.gguf", "--recipe", "Q4_0",
                   check=False)
    assert p.returncode == 1 and "refused without --allow-requantize" in p.stderr, p.stderr


@pytest.mark.parametrize("mix", ["F16", "bf16", "32", "F32"])
def test_float_mix_requantize_needs_the_option(models, tmp_path, mix):
    """llama-quantize's float mixes dequantize a quantized input only with --allow-requantize
    (tensor by tensor: "requantizing from type q8_0 is disabled"); COPY needs none."""
    p = run_quantd("convert", "--in", models["llama-q8_0"], "--out", tmp_path / "o.gguf", "--recipe", mix,
                   check=False)
    assert p.returncode == 1 and "refused without --allow-requantize" in p.stderr, p.stderr
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("spelling,case", [("1", "mix_f16"), ("f16", "mix_f16"), ("Copy", "mix_copy")])
def test_float_mix_by_number_or_any_case(models, tmp_path, spelling, case):
    """The float mixes and COPY by llama-quantize's id (1: F16) or any case; --fmt 1 is the F16 mix."""
    fix = FIX["cases"][case]
    out = tmp_path / "out.gguf"
    run_quantd("convert", "--in", models[fix["model"]], "--out", out, "--recipe", spelling)
    assert sha256(out) == fix["sha256"]
    if spelling == "1":
        out.unlink()
        run_quantd("convert", "--in", models[fix["model"]], "--out", out, "--fmt", "1")
        assert sha256(out) == fix["sha256"]


def test_float_mix_takes_no_param(models, tmp_path):
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "F16",
                   "--param", "group_size=32", check=False)
    assert p.returncode == 2 and "--param does not apply to the F16 mix" in p.stderr, p.stderr


def test_float_mix_line_names_the_type(models, tmp_path):
    """The per-tensor line names the float type written."""
    p = run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "o.gguf", "--recipe", "BF16")
    lines = {l["name"]: l["fmt"] for l in map(json.loads, p.stdout.splitlines()[:-1])}
    assert lines["blk.0.attn_q.weight"] == "bf16" and lines["output_norm.weight"] == "copied", lines


def test_options_need_gguf_output(tmp_path):
    from conftest import TINY_HF
    src = tmp_path / "hf"
    subprocess.run([sys.executable, TINY_HF, str(src)], check=True)
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "o", "--fmt", "nf4", "--pure", check=False)
    assert p.returncode == 1 and "apply to GGUF output" in p.stderr, p.stderr


@pytest.fixture(scope="module")
def service(models, tmp_path_factory):
    """quantd serve on a free loopback port, its --data-dir holding the tiny models."""
    import shutil
    import socket
    import time
    import urllib.request
    data = tmp_path_factory.mktemp("data")
    for name in ("llama", "qwen2"):
        shutil.copy(models[name], data / f"{name}.gguf")
    shutil.copy(models["DIR"] / "llama.imatrix.gguf", data / "llama.imatrix.gguf")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from conftest import QUANTD
    p = subprocess.Popen([QUANTD, "serve", "--listen", f"127.0.0.1:{port}", "--backend", "cpu", "--data-dir",
                          str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/readyz", timeout=1)
            break
        except Exception:
            time.sleep(0.05)
    yield base, data
    p.terminate()
    assert p.wait(timeout=30) == 0


def http(method, url, body=None, headers=None):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def run_job(base, body):
    import time
    status, r = http("POST", base + "/jobs?op=convert", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})
    assert status == 202, r
    job = json.loads(r)["id"]
    for _ in range(600):
        status, r = http("GET", f"{base}/jobs/{job}/result")
        if status != 409:
            return status, json.loads(r)
        time.sleep(0.05)
    raise AssertionError("the job did not finish")


@pytest.mark.parametrize("key", ["tensor_type", "override_kv", "prune_layers", "leave_output_tied", "mix_iq3_s",
                                 "imatrix_pure_iq1_s"])
def test_job_takes_the_options(service, key):
    """A conversion job with the options as members (llama-quantize's names, '_' for '-'; a
    repeatable one as a list) writes llama-quantize's file."""
    base, data = service
    case = FIX["cases"][key]
    body = {"source": f"{case['model']}.gguf", "destination": f"{key}.gguf", "recipe": case["mix"],
            "overwrite": True}
    opts = case["options"]
    i = 0
    while i < len(opts):
        name = opts[i][2:].replace("-", "_")
        if i + 1 == len(opts) or opts[i + 1].startswith("--"):
            body[name] = True
            i += 1
            continue
        if name in ("tensor_type", "override_kv"):
            body.setdefault(name, []).append(opts[i + 1])
        elif name == "prune_layers":
            body[name] = [int(x) for x in opts[i + 1].split(",")]
        else:
            body[name] = opts[i + 1]
        i += 2
    status, r = run_job(base, body)
    assert status == 200, r
    assert sha256(data / f"{key}.gguf") == case["sha256"]


def test_convert_route_takes_the_options(service, models):
    """POST /convert with the options in the query (repeated for the repeatable ones) answers
    llama-quantize's file; with dry_run, the types and the size instead."""
    import urllib.parse
    base, _ = service
    case = FIX["cases"]["tensor_type"]
    query = [("recipe", case["mix"])] + [("tensor-type", v) for v in case["options"][1::2]]
    body = open(models["llama"], "rb").read()
    hdr = {"Content-Type": "application/octet-stream"}
    status, r = http("POST", base + "/convert?" + urllib.parse.urlencode(query), body, hdr)
    assert status == 200 and hashlib.sha256(r).hexdigest() == case["sha256"], r[:200]
    status, r = http("POST", base + "/convert?" + urllib.parse.urlencode(query + [("dry_run", "true")]), body, hdr)
    summary = json.loads(r)
    assert status == 200 and summary["dry_run"] is True and summary["bytes_out"] == case["bytes"], summary
    assert summary["tensors"]["blk.0.attn_v.weight"] == "q8_0" and summary["tensors"]["blk.1.ffn_down.weight"] == "q5_0"


@pytest.mark.parametrize("member,says", [
    ({"pure": "true"}, "pure takes true or false"),
    ({"output_tensor_type": ["q8_0"]}, "output_tensor_type takes a string"),
    ({"tensor_type": ["attn_v=q8_0", 3]}, "tensor_type: every item is a string"),
    ({"prune_layers": [1, -1]}, "prune_layers: every item is a layer number"),
    ({"override_kv": "a=int:1.5"}, "'1.5' is not an integer"),
    ({"tensor-type": "attn_v=q8_0"}, "unknown field 'tensor-type'"),
])
def test_job_refuses_bad_options(service, member, says):
    base, _ = service
    body = {"source": "llama.gguf", "destination": "bad.gguf", "recipe": "Q4_0", **member}
    status, r = http("POST", base + "/jobs?op=convert", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert status == 400 and says in json.loads(r)["error"]["message"], r


@pytest.mark.parametrize("query,says", [
    ([("tensor_type", "attn_v=q9")], "not a ggml type"),
    ([("tensor_type_file", "/etc/passwd")], "reads a file of the server's"),
    ([("pure", "maybe")], "--pure takes true or false"),
    ([("pure", "1")], "--pure takes true or false"),
])
def test_convert_route_refuses_bad_options(service, models, query, says):
    import urllib.parse
    base, _ = service
    status, r = http("POST", base + "/convert?" + urllib.parse.urlencode([("recipe", "Q4_0")] + query),
                     open(models["llama"], "rb").read(), {"Content-Type": "application/octet-stream"})
    assert status == 400 and says in json.loads(r)["error"]["message"], r


FLOAT_MIXES = sorted(k for k, c in FIX["cases"].items() if c["mix"] in ("F16", "BF16", "F32", "COPY"))


@pytest.mark.parametrize("key", FLOAT_MIXES)
def test_float_mix_over_http(service, models, key):
    """The float mixes and COPY as a job and over POST /convert: llama-quantize's own file, the
    summary's fmt the mix's name."""
    import shutil
    base, data = service
    case = FIX["cases"][key]
    shutil.copy(models[case["model"]], data / f"{key}-in.gguf")
    requantize = "--allow-requantize" in case["options"]
    body = {"source": f"{key}-in.gguf", "destination": f"{key}.gguf", "recipe": case["mix"], "overwrite": True}
    if requantize:
        body["allow_requantize"] = True
    status, r = run_job(base, body)
    assert status == 200 and r["fmt"] == case["mix"] and r["recipe"] == case["mix"], r
    assert sha256(data / f"{key}.gguf") == case["sha256"]
    query = f"recipe={case['mix']}" + ("&allow_requantize=true" if requantize else "")
    status, r = http("POST", base + "/convert?" + query, open(models[case["model"]], "rb").read(),
                     {"Content-Type": "application/octet-stream"})
    assert status == 200 and hashlib.sha256(r).hexdigest() == case["sha256"], r[:200]


def write_bad_imatrix(path, kind):
    """Malformed importance matrices, each one llama-quantize refuses too."""
    import struct
    import numpy as np
    if kind == "truncated_dat":
        path.write_bytes(struct.pack("<ii", 1, 19) + b"blk.0.attn_q.weight" + struct.pack("<ii", 1, 256) + b"\0" * 100)
    elif kind == "empty_dat":
        path.write_bytes(struct.pack("<i", 0))
    elif kind == "nan_dat":
        v = np.ones(256, np.float32)
        v[5] = np.nan
        path.write_bytes(struct.pack("<i", 1) + struct.pack("<i", 19) + b"blk.0.attn_q.weight" + struct.pack("<ii", 1, 256)
                         + v.tobytes())
    elif kind in ("no_metadata", "no_counts"):
        w = gguf.GGUFWriter(str(path), arch="")
        if kind == "no_counts":
            w.add_array("imatrix.datasets", ["x"])
            w.add_uint32("imatrix.chunk_count", 1)
            w.add_uint32("imatrix.chunk_size", 512)
        w.add_tensor("blk.0.attn_q.weight.in_sum2", np.ones((1, 256), np.float32))
        if kind == "no_metadata":
            w.add_tensor("blk.0.attn_q.weight.counts", np.ones((1, 1), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


@pytest.mark.parametrize("kind,says", [
    ("truncated_dat", "the file ends inside an entry's values"),
    ("empty_dat", "no entries"),
    ("nan_dat", "holds a value that is not finite"),
    ("no_metadata", "missing imatrix metadata"),
    ("no_counts", "mismatched sums and counts for blk.0.attn_q.weight"),
])
def test_bad_imatrix_is_refused(models, tmp_path, kind, says):
    bad = tmp_path / "bad.imatrix"
    write_bad_imatrix(bad, kind)
    out = tmp_path / "out.gguf"
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--imatrix", bad, "--recipe", "Q4_K_M", check=False)
    assert p.returncode == 1 and says in p.stderr and "--imatrix" in p.stderr, p.stderr
    assert not out.exists()


@pytest.mark.parametrize("args,says", [
    (["--recipe", "Q2_K_S"], "requires an importance matrix"),
    (["--recipe", "IQ2_XXS"], "requires an importance matrix (--imatrix FILE"),
    (["--recipe", "iq2_m"], "tensor 'blk.0.attn_k.weight' would be iq2_s"),
    (["--recipe", "Q4_K_M", "--tensor-type", "ffn_up=iq2_xs"], "tensor 'blk.0.ffn_up.weight' would be iq2_xs"),
    (["--recipe", "IQ2_XS", "--imatrix", "llama.imatrix.gguf", "--pure", "--exclude-weights", "token_embd"],
     "tensor token_embd.weight would be iq2_xs, which quantizes only with an importance"),
    (["--recipe", "IQ2_XXS", "--imatrix", "llama.imatrix.gguf", "--output-tensor-type", "iq2_xxs",
      "--exclude-weights", "output"], "tensor output.weight would be iq2_xxs, which quantizes only with an importance"),
    (["--recipe", "IQ2_S", "--imatrix", "llama.imatrix.gguf", "--exclude-weights", "attn_k"],
     "the importance matrix has no entry for tensor blk.0.attn_k.weight"),
    (["--recipe", "q2_k_s", "--imatrix", "llama.imatrix.gguf", "--include-weights", "ffn"],
     "the importance matrix has no entry for tensor blk.0.attn_k.weight"),
    (["--recipe", "Q4_0", "--imatrix", "llama.imatrix.gguf", "--include-weights", "a", "--exclude-weights", "b"],
     "cannot be used together"),
    (["--recipe", "Q4_K_M", "--imatrix", "llama-tied.imatrix.dat"], "it was made for another model"),
    (["--recipe", "Q4_K_M", "--imatrix", "missing.dat"], "--imatrix: missing.dat"),
])
def test_imatrix_refusals(models, tmp_path, args, says):
    """llama-quantize's imatrix rules: Q2_K_S needs one (its Q2_K tensors), and so do the IQ2 types
    (by a mix or by --tensor-type), an entry for each of those tensors, one kind of weight filter,
    entries the model's size."""
    from conftest import QUANTD
    out = tmp_path / "out.gguf"
    p = subprocess.run([QUANTD, "convert", "--in", models["llama"], "--out", out, *args], capture_output=True,
                       text=True, cwd=models["DIR"])
    assert p.returncode in (1, 2) and says in p.stderr, p.stderr
    assert not out.exists()


def test_dry_run_without_the_imatrix_it_needs(models):
    """--dry-run plans Q2_K_S without an imatrix (llama-quantize warns that the real run needs one)."""
    case = FIX["cases"]["imatrix_q2_k_s"]
    p = run_quantd("convert", "--in", models["llama"], "--dry-run", "--recipe", "Q2_K_S")
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    assert summary["bytes_out"] < case["bytes"] + 200  # (the imatrix keys are not in it)


def test_job_takes_an_imatrix(service, models):
    """A job's imatrix is a path in --data-dir, recorded as given; one outside it is refused, and
    POST /convert (one file in) refuses one."""
    import shutil
    base, data = service
    case = FIX["cases"]["imatrix_dat_q4_k_m"]
    shutil.copy(models["DIR"] / "llama.imatrix.dat", data / "llama.imatrix.dat")
    status, r = run_job(base, {"source": "llama.gguf", "destination": "im.gguf", "recipe": "Q4_K_M",
                               "imatrix": "llama.imatrix.dat", "overwrite": True})
    assert status == 200, r
    assert sha256(data / "im.gguf") == case["sha256"]
    status, r = run_job(base, {"source": "llama.gguf", "destination": "iq2.gguf", "recipe": "IQ2_M",
                               "imatrix": "llama.imatrix.dat", "overwrite": True})
    assert status == 200, r
    assert sha256(data / "iq2.gguf") == FIX["cases"]["imatrix_iq2_m"]["sha256"]
    for path, code in (("../llama.imatrix.dat", 403), ("missing.dat", 404)):
        status, r = http("POST", base + "/jobs?op=convert",
                         json.dumps({"source": "llama.gguf", "destination": "x.gguf", "recipe": "Q4_0",
                                     "imatrix": path}).encode(), {"Content-Type": "application/json"})
        assert status == code, r
    status, r = http("POST", base + "/convert?recipe=Q4_0&imatrix=x.dat", open(models["llama"], "rb").read(),
                     {"Content-Type": "application/octet-stream"})
    assert status == 400 and "POST /convert takes one" in json.loads(r)["error"]["message"], r
    status, r = http("POST", base + "/convert?recipe=IQ2_XS", open(models["llama"], "rb").read(),
                     {"Content-Type": "application/octet-stream"})
    assert status in (400, 422) and "requires an importance matrix" in json.loads(r)["error"]["message"], r


def fields(path):
    """key -> (value type, value) of a GGUF's metadata, in order."""
    r = gguf.GGUFReader(str(path))
    out = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        v = [bytes(f.parts[i]).hex() for i in f.data]
        out.append((f.name, [int(t) for t in f.types], v))
    return out


@pytest.mark.parametrize("option,value,files", [("--split-max-tensors", "8", 4), ("--split-max-size", "1M", 2)])
def test_split_output_as_gguf_split_writes_it(models, tmp_path, option, value, files):
    """gguf-split's layout over llama-quantize's file: -0000N-of-0000M.gguf names, tensors in
    order cut by count or by their padded bytes, every key in the first split, then split.no
    (u16), split.tensors.count (i32), split.count (u16) in each; the tensors are llama-quantize's."""
    case = FIX["cases"]["tensor_type"]
    whole = tmp_path / "whole.gguf"
    run_quantd("convert", "--in", models["llama"], "--out", whole, *case["options"], "--recipe", case["mix"])
    assert sha256(whole) == case["sha256"]
    run_quantd("convert", "--in", models["llama"], "--out", tmp_path / "split.gguf", option, value,
               *case["options"], "--recipe", case["mix"])
    names = sorted(p.name for p in tmp_path.glob("split-*"))
    assert names == [f"split-{k:05d}-of-{files:05d}.gguf" for k in range(1, files + 1)] and not (tmp_path / "split.gguf").exists()
    ref = gguf.GGUFReader(str(whole))
    tensors = [(t.name, t.data.tobytes()) for t in ref.tensors]
    got, sizes = [], []
    for k, name in enumerate(names):
        r = gguf.GGUFReader(str(tmp_path / name))
        part = [(t.name, t.data.tobytes()) for t in r.tensors]
        got += part
        sizes.append(sum(-(-len(b) // 32) * 32 for _, b in part))
        kv = fields(tmp_path / name)
        head = fields(whole) if k == 0 else []
        u16, i32 = gguf.GGUFValueType.UINT16, gguf.GGUFValueType.INT32
        tail = [("split.no", [u16], [k.to_bytes(2, "little").hex()]),
                ("split.tensors.count", [i32], [len(tensors).to_bytes(4, "little").hex()]),
                ("split.count", [u16], [files.to_bytes(2, "little").hex()])]
        assert kv == head + tail, (name, kv[-4:])
    assert got == tensors
    if option == "--split-max-tensors":
        assert [len(gguf.GGUFReader(str(tmp_path / n)).tensors) for n in names] == [8, 8, 8, 6]
    else:
        assert all(s <= 1000000 for s in sizes)


def test_split_refusals(models, tmp_path):
    out = tmp_path / "s.gguf"
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--split-max-tensors", "8", "--split-max-size",
                   "1G", "--recipe", "Q4_0", check=False)
    assert p.returncode == 2 and "not both" in p.stderr
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--split-max-size", "100K", "--recipe", "Q4_0",
                   check=False)
    assert p.returncode == 2 and "M (10^6 bytes) or G" in p.stderr
    (tmp_path / "s-00002-of-00004.gguf").write_bytes(b"mine")
    p = run_quantd("convert", "--in", models["llama"], "--out", out, "--split-max-tensors", "8", "--recipe", "Q4_0",
                   check=False)
    assert p.returncode == 1 and "exists" in p.stderr and (tmp_path / "s-00002-of-00004.gguf").read_bytes() == b"mine"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s-00002-of-00004.gguf"]


def test_job_writes_splits(service):
    """A job with split_max_tensors writes the splits in --data-dir; POST /convert (one file
    out) refuses a split."""
    base, data = service
    status, r = run_job(base, {"source": "llama.gguf", "destination": "sp.gguf", "recipe": "Q4_0",
                               "split_max_tensors": 10, "overwrite": True})
    assert status == 200, r
    assert sorted(p.name for p in data.glob("sp-*")) == [f"sp-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
    status, r = http("POST", base + "/convert?recipe=Q4_0&split_max_tensors=10", b"GGUF", {"Content-Type": "application/octet-stream"})
    assert status == 400 and "several files" in json.loads(r)["error"]["message"], r
