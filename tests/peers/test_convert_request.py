"""One conversion request, one answer, whichever way it comes: the same table of requests (good
and bad names in several cases, llama-quantize's numbers, --pure, back to float, params, --skip /
--only, each of llama-quantize's options with good and bad values) through `quantd convert`,
POST /convert (the model in the body, the request in the query) and POST /jobs?op=convert (a
JSON body), and through `quantd llama-quantize` where its command line can say it. Every way
must give the same outcome: the same bytes out (the same summary), or the same refusal with the
same message (server/checkpoint/convert_request.c resolves them all)."""
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import QUANTD, ROOT, tiny_hf

TINY_GGUF = os.path.join(ROOT, "tests", "checkpoint", "tiny_gguf.py")
TINY_IMATRIX = os.path.join(ROOT, "tests", "checkpoint", "tiny_imatrix.py")

# (name, source, request, expected): request items in order, as the command line gives them
# (key, value): "fmt", "recipe", "skip", "only", "param" ("k=v") or one of llama-quantize's
# options (value None: a flag); expected "ok" or the API's error code.
TABLE = [
    ("fmt", "m.gguf", [("fmt", "q8_0")], "ok"),
    ("fmt_upper", "m.gguf", [("fmt", "Q8_0")], "ok"),
    ("fmt_kquant_upper", "m.gguf", [("fmt", "Q4_K")], "ok"),
    ("recipe_lower", "m.gguf", [("recipe", "q4_k_m")], "ok"),
    ("recipe_mixed", "m.gguf", [("recipe", "Q4_k_M")], "ok"),
    ("recipe_number", "m.gguf", [("recipe", "15")], "ok"),
    ("fmt_number_is_pure", "m.gguf", [("fmt", "2")], "ok"),
    ("recipe_pure", "m.gguf", [("recipe", "Q4_K_M"), ("pure", None)], "ok"),
    ("float_mix", "m.gguf", [("recipe", "f16")], "ok"),
    ("copy", "m.gguf", [("recipe", "Copy")], "ok"),
    ("skip", "m.gguf", [("fmt", "q4_0"), ("skip", "^output")], "ok"),
    ("only", "m.gguf", [("fmt", "q4_0"), ("only", "attn")], "ok"),
    ("leave_output", "m.gguf", [("recipe", "Q4_K_M"), ("leave-output-tensor", None)], "ok"),
    ("output_type", "m.gguf", [("recipe", "Q4_K_M"), ("output-tensor-type", "Q8_0")], "ok"),
    ("embedding_type", "m.gguf", [("recipe", "Q4_K_M"), ("token-embedding-type", "q8_0")], "ok"),
    ("tensor_types", "m.gguf", [("recipe", "Q4_K_M"), ("tensor-type", "attn_v=q8_0"),
                                ("tensor-type", "FFN_DOWN=Q5_0")], "ok"),
    ("override_kv", "m.gguf", [("recipe", "Q4_0"), ("override-kv", "general.name=str:renamed")], "ok"),
    ("prune", "m.gguf", [("recipe", "Q4_0"), ("prune-layers", "1")], "ok"),
    ("requantize", "m-q8_0.gguf", [("recipe", "q4_0"), ("allow-requantize", None)], "ok"),
    ("dry_run", "m.gguf", [("recipe", "Q4_K_S"), ("dry-run", None)], "ok"),
    ("nf4_params", "hf/model.safetensors", [("fmt", "NF4"), ("param", "blocksize=128")], "ok"),
    ("unknown_fmt", "m.gguf", [("fmt", "nope")], "unknown_format"),
    ("empty_fmt", "m.gguf", [("fmt", "")], "unknown_format"),
    ("mix_as_fmt", "m.gguf", [("fmt", "q4_k_m")], "unknown_format"),
    ("float_mix_as_fmt", "m.gguf", [("fmt", "COPY")], "unknown_format"),
    ("unknown_recipe", "m.gguf", [("recipe", "Q9")], "unknown_recipe"),
    ("fmt_as_recipe", "m.gguf", [("recipe", "nf4")], "unknown_recipe"),
    ("fmt_and_recipe", "m.gguf", [("fmt", "q4_0"), ("recipe", "Q4_0")], "bad_request"),
    ("no_fmt", "m.gguf", [], "missing_format"),
    ("unknown_param", "m.gguf", [("fmt", "q8_0"), ("param", "blocksize=64")], "unknown_param"),
    ("bad_param", "hf/model.safetensors", [("fmt", "nf4"), ("param", "blocksize=3")], "bad_param"),
    ("param_to_float_mix", "m.gguf", [("recipe", "F16"), ("param", "blocksize=64")], "bad_param"),
    ("param_back_to_float", "m.gguf", [("fmt", "BF16"), ("param", "blocksize=64")], "bad_param"),
    ("bad_skip", "m.gguf", [("fmt", "q8_0"), ("skip", "(")], "bad_request"),
    ("huge_only", "m.gguf", [("fmt", "q8_0"), ("only", "((a{1,50}){1,50})")], "bad_request"),
    ("tensor_type_no_eq", "m.gguf", [("recipe", "Q4_K_M"), ("tensor-type", "attn_v")], "bad_param"),
    ("tensor_type_bad_re", "m.gguf", [("recipe", "Q4_K_M"), ("tensor-type", "attn(=q8_0")], "bad_param"),
    ("tensor_type_huge", "m.gguf", [("recipe", "Q4_K_M"), ("tensor-type", "((a{1,50}){1,50})=q8_0")],
     "bad_param"),
    ("tensor_type_bad_type", "m.gguf", [("recipe", "Q4_K_M"), ("tensor-type", "attn_v=q9_9")], "bad_param"),
    ("output_type_bad", "m.gguf", [("recipe", "Q4_K_M"), ("output-tensor-type", "q3")], "bad_param"),
    ("embedding_type_bad", "m.gguf", [("recipe", "Q4_K_M"), ("token-embedding-type", "nope")], "bad_param"),
    ("override_kv_bad", "m.gguf", [("recipe", "Q4_0"), ("override-kv", "a=int:x")], "bad_param"),
    ("prune_bad", "m.gguf", [("recipe", "Q4_0"), ("prune-layers", "1,-2")], "bad_param"),
    ("weights_both", "m.gguf", [("recipe", "Q4_0"), ("include-weights", "a"), ("exclude-weights", "b")],
     "bad_param"),
    ("split_size_bad", "m.gguf", [("recipe", "Q4_0"), ("split-max-size", "100K")], "bad_param"),
    ("split_count_bad", "m.gguf", [("recipe", "Q4_0"), ("split-max-tensors", "0")], "bad_param"),
    ("include_weights", "m.gguf", [("recipe", "Q4_0"), ("include-weights", "attn")], "ok"),
    ("option_no_value", "m.gguf", [("recipe", "Q4_0"), ("output-tensor-type", "")], "bad_param"),
]
REPEATED = ("tensor_type", "override_kv", "include_weights", "exclude_weights")


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """quantd serve with --data-dir holding the inputs: a tiny GGUF (f16), its q8_0 (for
    requantizing), a tiny Hugging Face model."""
    data = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, TINY_GGUF, str(data / "m.gguf"), "f16"], check=True)
    subprocess.run([QUANTD, "convert", "--in", data / "m.gguf", "--out", data / "m-q8_0.gguf", "--recipe", "Q8_0"],
                   check=True, capture_output=True)
    tiny_hf(data / "hf")
    subprocess.run([sys.executable, TINY_IMATRIX, str(data / "m.gguf"), str(data / "m.imatrix.gguf"), "gguf"],
                   check=True)
    (data / "types.txt").write_text("attn_v=q8_0 ffn_down=q5_0\n")
    for d in ("cli", "lq", "job"):
        (data / d).mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([QUANTD, "serve", "--listen", f"127.0.0.1:{port}", "--backend", "cpu", "--data-dir",
                          str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/readyz", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield base, data
    p.terminate()
    assert p.wait(timeout=30) == 0


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def out_name(source, name):
    return name + (".safetensors" if source.endswith(".safetensors") else ".gguf")


def dry(request):
    return any(k == "dry-run" for k, _ in request)


def via_cli(data, name, source, request):
    """quantd convert: (outcome, message or (bytes, summary))."""
    args = []
    for k, v in request:
        args += [f"--{k}"] + ([] if v is None else [v])
    out = os.path.join("cli", out_name(source, name))
    p = subprocess.run([QUANTD, "convert", "--in", source, *([] if dry(request) else ["--out", out]), *args],
                       capture_output=True, text=True, cwd=data, timeout=300)
    if p.returncode:
        assert p.returncode == 2, (name, p.returncode, p.stderr)  # a request refused is a usage error
        line = p.stderr.strip().splitlines()[-1]
        assert line.startswith("quantd convert: "), line
        return "error", line[len("quantd convert: "):]
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    return "ok", (None if dry(request) else (data / out).read_bytes(), summary)


def via_llama_quantize(data, name, source, request):
    """quantd llama-quantize OPTIONS IN OUT TYPE: the same outcome, where its command line can
    say the request (a mix and llama-quantize's options)."""
    args, mix = [], None
    for k, v in request:
        if k == "recipe":
            mix = v
        else:
            args += [f"--{k}"] + ([] if v is None else [v])
    out = os.path.join("lq", out_name(source, name))
    p = subprocess.run([QUANTD, "llama-quantize", *args, source, out, mix, "1"], capture_output=True, text=True,
                       cwd=data, timeout=300)
    if p.returncode:
        assert p.returncode == 2, (name, p.returncode, p.stderr)
        line = p.stderr.strip().splitlines()[-1]
        assert line.startswith("quantd llama-quantize: "), line
        return "error", line[len("quantd llama-quantize: "):]
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    return "ok", (None if dry(request) else (data / out).read_bytes(), summary)


def via_convert_route(base, data, name, source, request):
    """POST /convert: the request in the query (a flag as true), the model in the body."""
    query = [(k.replace("-", "_"), "true" if v is None else v) for k, v in request]
    query = [(v.split("=", 1)[0], v.split("=", 1)[1]) if k == "param" else (k, v) for k, v in query]
    status, headers, body = http("POST", base + "/convert?" + urllib.parse.urlencode(query),
                                 (data / source).read_bytes(), {"Content-Type": "application/octet-stream"})
    if status != 200:
        err = json.loads(body)["error"]
        return "error", (err["code"], err["message"])
    if dry(request):
        return "ok", (None, json.loads(body))
    return "ok", (body, json.loads(headers["X-Quantd-Summary"]))


def via_job(base, data, name, source, request):
    """POST /jobs?op=convert: the request as JSON members (params an object, a flag true, a
    repeated option a list), polled to its result."""
    body = {"source": source, "destination": "job/" + out_name(source, name), "overwrite": True}
    for k, v in request:
        k = k.replace("-", "_")
        if k == "param":
            body.setdefault("params", {})[v.split("=", 1)[0]] = v.split("=", 1)[1]
        elif k in REPEATED:
            body.setdefault(k, []).append(v)
        elif k == "split_max_tensors":  # a count is a JSON number
            body[k] = int(v)
        else:
            body[k] = True if v is None else v
    status, _, r = http("POST", base + "/jobs?op=convert", json.dumps(body).encode(),
                        {"Content-Type": "application/json"})
    if status != 202:
        err = json.loads(r)["error"]
        return "error", (err["code"], err["message"])
    job = json.loads(r)["id"]
    for _ in range(1200):
        status, _, r = http("GET", f"{base}/jobs/{job}/result")
        if status != 409:
            break
        time.sleep(0.05)
    assert status == 200, (name, status, r)
    return "ok", (None if dry(request) else (data / body["destination"]).read_bytes(), json.loads(r))


# what every way's summary shares (the rest is timing, paths, the process's memory)
COMMON = ("recipe", "pure", "dry_run", "fmt", "quantized", "copied", "cast_f16", "bytes_in", "bytes_out",
          "bits_per_weight", "imatrix", "imatrix_entries", "imatrix_covered")


def common(summary):
    return {k: summary.get(k) for k in COMMON}


@pytest.mark.parametrize("name,source,request_,expected", TABLE, ids=[r[0] for r in TABLE])
def test_same_request_same_answer(service, name, source, request_, expected):
    base, data = service
    cli = via_cli(data, name, source, request_)
    route = via_convert_route(base, data, name, source, request_)
    job = via_job(base, data, name, source, request_)
    lq_says = all(k not in ("fmt", "param", "skip", "only") for k, _ in request_) and \
        any(k == "recipe" for k, _ in request_)
    lq = via_llama_quantize(data, name, source, request_) if lq_says else None
    if expected != "ok":
        assert cli[0] == "error", (name, cli)
        for way, got in (("/convert", route), ("/jobs", job)):
            assert got[0] == "error", (name, way, got)
            code, message = got[1]
            assert code == expected, (name, way, code, message)
            assert message == cli[1], (name, way, message, cli[1])
        if lq:
            assert lq == cli, (name, lq, cli)
        return
    assert cli[0] == "ok", (name, cli)
    cli_bytes, cli_summary = cli[1]
    for way, got in (("/convert", route), ("/jobs", job), ("llama-quantize", lq)):
        if got is None:
            continue
        assert got[0] == "ok", (name, way, got)
        out, summary = got[1]
        if cli_bytes is not None:
            assert sha(out) == sha(cli_bytes), (name, way)
        assert common(summary) == common(cli_summary), (name, way, summary, cli_summary)


@pytest.mark.parametrize("name,request_,refused_by", [
    ("imatrix", [("recipe", "Q4_K_M"), ("imatrix", "m.imatrix.gguf")],
     {"/convert": "imatrix names a file: POST /convert takes one"}),
    ("imatrix_exclude", [("recipe", "Q4_K_M"), ("imatrix", "m.imatrix.gguf"), ("exclude-weights", "ffn_up")],
     {"/convert": "imatrix names a file: POST /convert takes one"}),
    ("types_file", [("recipe", "Q4_K_M"), ("tensor-type-file", "types.txt")],
     {"/convert": "tensor_type_file reads a file of the server's", "/jobs": "tensor_type_file reads a file of the "
      "server's"}),
])
def test_same_answer_where_the_way_takes_it(service, name, request_, refused_by):
    """What names a second file: the command line's relative to its directory, a job's in
    --data-dir, and refused (400) where HTTP cannot take it; where taken, the same bytes and
    summary (an imatrix's coverage included) everywhere."""
    base, data = service
    cli = via_cli(data, name, "m.gguf", request_)
    assert cli[0] == "ok", cli
    ways = {"/convert": via_convert_route(base, data, name, "m.gguf", request_),
            "/jobs": via_job(base, data, name, "m.gguf", request_),
            "llama-quantize": via_llama_quantize(data, name, "m.gguf", request_)}
    for way, got in ways.items():
        if way in refused_by:
            assert got[0] == "error" and got[1][0] == "bad_request" and refused_by[way] in got[1][1], (way, got)
            continue
        assert got[0] == "ok", (name, way, got)
        assert sha(got[1][0]) == sha(cli[1][0]), (name, way)
        assert common(got[1][1]) == common(cli[1][1]), (name, way, got[1][1], cli[1][1])
    if name.startswith("imatrix"):
        s = cli[1][1]
        assert s["imatrix"] == "m.imatrix.gguf" and 0 < s["imatrix_covered"] <= s["quantized"], s
        assert (s["imatrix_covered"] < s["quantized"]) == (name == "imatrix_exclude"), s


def test_names_resolve_as_their_canonical_spelling(tmp_path):
    """Spellings write what the canonical name writes: Q8_0 is q8_0, q4_k_m and 15 are Q4_K_M,
    --fmt 2 is --recipe Q4_0 --pure."""
    src = tmp_path / "m.gguf"
    subprocess.run([sys.executable, TINY_GGUF, str(src), "f16"], check=True)

    def written(*args):
        out = tmp_path / "out.gguf"
        subprocess.run([QUANTD, "convert", "--in", src, "--out", out, "--force", *args], check=True,
                       capture_output=True)
        return out.read_bytes()

    assert written("--fmt", "Q8_0") == written("--fmt", "q8_0")
    assert written("--recipe", "q4_k_m") == written("--recipe", "15") == written("--recipe", "Q4_K_M")
    assert written("--fmt", "2") == written("--recipe", "Q4_0", "--pure")
    assert written("--fmt", "2") != written("--recipe", "Q4_K_M")  # (the comparisons can fail)
