"""Validates the answers the service tests recorded (QUANTD_RESPONSES, one JSON line per
response) against api/openapi.yaml: every status must be documented for its path and method,
every JSON body must match its schema, and every documented operation must have been exercised."""
import json
import struct
import tempfile
import os
import pathlib
import re
import subprocess

import jsonschema
import pytest
import yaml
from openapi_spec_validator import validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "api" / "openapi.yaml").read_text())


def recorded():
    path = os.environ.get("QUANTD_RESPONSES")
    if not path or not os.path.exists(path):
        pytest.fail("QUANTD_RESPONSES is not set or missing: run the service tests first (make test-service)")
    with open(path) as f:
        return [json.loads(line) for line in f]


def template_of(path):
    """The spec path template a concrete path matches, or None."""
    path = path.split("?", 1)[0]
    if path.startswith("/v1/"):
        path = path[3:]
    for t in SPEC["paths"]:
        rx = "^" + re.sub(r"\{[^}]+\}", "[^/]+", t) + "$"
        if re.match(rx, path):
            return t
    return None


def resolve(node):
    while isinstance(node, dict) and "$ref" in node and len(node) == 1:
        ref = node["$ref"].lstrip("#/").split("/")
        node = SPEC
        for k in ref:
            node = node[k]
    return node


def check_schema(body, schema):
    # the spec's components ride along so that '#/components/...' refs resolve in place
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": SPEC["components"], **schema}
    jsonschema.Draft202012Validator(root).validate(body)


def test_spec_is_valid_openapi_3_1():
    assert SPEC["openapi"].startswith("3.1")
    validate(SPEC)


def test_format_enum_is_the_registry():
    quantd = os.environ.get("QUANTD", str(ROOT / "bin" / "quantd"))
    names = [f["name"] for f in json.loads(subprocess.check_output([quantd, "formats"]))["formats"]]
    assert SPEC["components"]["schemas"]["Format"]["enum"] == names


def test_component_names_are_the_registry():
    quantd = os.environ.get("QUANTD", str(ROOT / "bin" / "quantd"))
    out = json.loads(subprocess.check_output([quantd, "formats"]))
    names = {c["name"] for f in out["formats"] for c in f["components"]}
    # components that only non-default parameters lay out: w4a16's zero point (symmetric=false),
    # fp8_e4m3's weight_scale_inv (flow=transformers)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "w.f32")
        with open(src, "wb") as f:
            f.write(struct.pack("<1024f", *[(i % 37) / 37.0 - 0.5 for i in range(1024)]))
        for fmt, param in (("w4a16", "symmetric=false"), ("fp8_e4m3", "flow=transformers")):
            subprocess.run([quantd, "quantize", "--fmt", fmt, "--dtype", "f32", "--shape", "8,128", "--in", src,
                            "--out", os.path.join(d, fmt), "--param", param], check=True)
            with open(os.path.join(d, fmt, "meta.json")) as f:
                names |= set(json.load(f)["components"])
    assert set(SPEC["components"]["schemas"]["ComponentName"]["enum"]) == names


def test_recorded_answers_match_the_spec():
    answers = recorded()
    assert len(answers) > 100
    for a in answers:
        t = template_of(a["path"])
        if a["status"] == 404 and t is None:
            check_schema(a["body"], {"$ref": "#/components/schemas/Error"})
            continue
        assert t is not None, a["path"]
        method = "get" if a["method"] == "HEAD" else a["method"].lower()  # HEAD is GET without a body
        op = SPEC["paths"][t].get(method)
        if a["status"] == 405 and op is None:
            check_schema(a["body"], {"$ref": "#/components/schemas/Error"})
            continue
        assert op is not None, f"{a['method']} {t} is not documented"
        responses = op["responses"]
        assert str(a["status"]) in responses, f"{a['method']} {a['path']} answered undocumented {a['status']}"
        if a["body"] is None:
            continue
        resp = resolve(responses[str(a["status"])])
        content = resp.get("content", {})
        assert "application/json" in content, f"{a['method']} {t} {a['status']} has no JSON body in the spec"
        try:
            check_schema(a["body"], content["application/json"]["schema"])
        except jsonschema.ValidationError as e:
            pytest.fail(f"{a['method']} {a['path']} -> {a['status']}: {e.message}")


def test_every_documented_operation_was_exercised():
    seen = {(template_of(a["path"]), a["method"].lower()) for a in recorded()}
    for path, ops in SPEC["paths"].items():
        for method in ops:
            if method in ("get", "post", "delete", "put"):
                assert (path, method) in seen, f"{method.upper()} {path} never exercised by the service tests"


def operations():
    for path, ops in SPEC["paths"].items():
        for method, op in ops.items():
            if method in ("get", "post", "delete", "put"):
                yield path, method, op


def test_every_answer_has_examples_that_fit_its_schema():
    """Each status of each operation shows what the daemon sends: an example per JSON or text
    body, valid against the body's schema (error examples name a code the Error schema has)."""
    for path, method, op in operations():
        for status, resp in op["responses"].items():
            for media, content in resolve(resp).get("content", {}).items():
                if media == "application/octet-stream":
                    continue
                examples = content.get("examples", {})
                assert examples, f"{method.upper()} {path} {status} {media}: no example"
                for name, ex in examples.items():
                    if media == "application/json":
                        try:
                            check_schema(ex["value"], content["schema"])
                        except jsonschema.ValidationError as e:
                            pytest.fail(f"{method.upper()} {path} {status} example {name}: {e.message}")
                    if content["schema"] == {"$ref": "#/components/schemas/Error"}:
                        assert ex["value"]["error"]["code"] == name, f"{path} {status} example {name}"


def test_request_examples_fit_their_schemas():
    for path, method, op in operations():
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            for name, ex in content.get("examples", {}).items():
                check_schema(ex["value"], content["schema"])


def test_quantize_examples_are_the_daemons_bytes():
    """The /quantize and /dequantize examples are what quantd answers to the request example."""
    quantd = os.environ.get("QUANTD", str(ROOT / "bin" / "quantd"))
    import base64
    import socket
    import time
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([quantd, "serve", "--listen", f"127.0.0.1:{port}", "--backend", "cpu"],
                            stderr=subprocess.DEVNULL)
    try:
        def post(route, body):
            for _ in range(200):
                try:
                    r = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(),
                                               headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(r) as f:
                        return json.load(f)
                except urllib.error.URLError as e:
                    if isinstance(e, urllib.error.HTTPError):
                        raise
                    time.sleep(0.02)
            raise AssertionError("quantd serve did not answer")
        q = SPEC["paths"]["/quantize"]["post"]
        req = q["requestBody"]["content"]["application/json"]["examples"]["q8_0"]["value"]
        want = q["responses"]["200"]["content"]["application/json"]["examples"]["q8_0"]["value"]
        got = post("/quantize", req)
        for k in ("fmt", "dtype", "shape", "params", "tensors", "backend"):
            assert got[k] == want[k], k
        d = SPEC["paths"]["/dequantize"]["post"]
        dreq = d["requestBody"]["content"]["application/json"]["examples"]["q8_0"]["value"]
        assert dreq["tensors"] == want["tensors"]
        dwant = d["responses"]["200"]["content"]["application/json"]["examples"]["q8_0"]["value"]
        dgot = post("/dequantize", dreq)
        assert dgot["data"] == dwant["data"] and dgot["shape"] == dwant["shape"]
        # the round trip of this block is close to its input
        import struct
        x = struct.unpack("<32f", base64.b64decode(req["data"]))
        y = struct.unpack("<32f", base64.b64decode(dgot["data"]))
        assert max(abs(a - b) for a, b in zip(x, y)) < 0.04
    finally:
        proc.terminate()
        proc.wait()
