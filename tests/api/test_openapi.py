"""Validates the answers the service tests recorded (QUANTD_RESPONSES, one JSON line per
response) against api/openapi.yaml: every status must be documented for its path and method,
every JSON body must match its schema, and every documented operation must have been exercised."""
import json
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
