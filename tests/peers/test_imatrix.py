"""ggml's types with and without an importance vector, through the service: /quantize with the
JSON body's "importance" and /dequantize of what it returned, against the bytes and values ggml
itself produced (tests/fixtures/imatrix/ggml_quantize.json, made by
tests/fixtures/make_imatrix_fixtures.py through ggml_quantize_chunk, the call llama-quantize
makes with --imatrix). The inputs are planted hard rows (zeros, an outlier, subnormals, tiny
runs, a constant) and N(0, 0.02) rows; the importance vectors random positive, and random with
zero columns and zero blocks; a 3-D tensor of two experts (and the same flattened to 2-D) takes
one vector per expert."""
import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import FIXTURES, QUANTD

sys.path.insert(0, FIXTURES)
import make_imatrix_fixtures as mk  # noqa: E402

with open(os.path.join(FIXTURES, "imatrix", "ggml_quantize.json")) as _f:
    EXPECT = json.load(_f)
CASES = sorted(EXPECT["cases"])


def sha(b):
    return hashlib.sha256(b).hexdigest()[:16]


@pytest.fixture(scope="module")
def service():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([QUANTD, "serve", "--backend", "cpu", "--listen", f"127.0.0.1:{port}"],
                         stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(500):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1)
            break
        except OSError:
            time.sleep(0.02)
    yield base
    p.terminate()
    assert p.wait(timeout=30) == 0


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def quantize(base, fmt, x, imp, raw=None, dtype="f32"):
    body = {"fmt": fmt, "dtype": dtype, "shape": list(x.shape),
            "data": base64.b64encode(raw or np.ascontiguousarray(x, np.float32).tobytes()).decode()}
    if imp is not None:
        body["importance"] = {"dtype": "f32", "data": base64.b64encode(imp.astype(np.float32).tobytes()).decode()}
    return post(base, "/quantize", body)


def test_inputs_are_the_fixtures():
    """numpy's generators made the inputs the fixtures were made from (else every case below
    would fail for the wrong reason)."""
    x, imps = mk.rows(), mk.importances()
    ex, eimp = mk.experts()
    assert EXPECT["input_sha256"] == {"rows": sha(x.tobytes()), **{k: sha(v.tobytes()) for k, v in imps.items()},
                                      "experts": sha(ex.tobytes()) + sha(eimp.tobytes())}


@pytest.mark.parametrize("case", CASES)
def test_bytes_and_values_equal_ggml(service, case):
    fmt, kind = case.split("/")
    if kind == "experts":
        x, imp = mk.experts()
        imp = imp.reshape(-1)
    else:
        x = mk.rows()
        imp = None if kind == "none" else mk.importances()[kind.removeprefix("bf16-")]
    raw = mk.bf16_round(x)[1] if kind.startswith("bf16-") else None
    # the experts also flattened to [8, 512] (as a conversion hands a 3-D tensor over): two runs
    for shaped in [x] + ([x.reshape(-1, x.shape[-1])] if kind == "experts" else []):
        status, r = quantize(service, fmt, shaped, imp, raw, "bf16" if raw else "f32")
        assert status == 200, r
        got = base64.b64decode(r["tensors"]["data"]["data"])
        assert sha(got) == EXPECT["cases"][case]["bytes"], f"{case} {shaped.shape}: bytes differ from ggml's"
        status, d = post(service, "/dequantize?dtype=f32", r)
        assert status == 200, d
        assert sha(base64.b64decode(d["data"])) == EXPECT["cases"][case]["dequantized"], f"{case}: values differ"


@pytest.mark.parametrize("fmt", sorted(mk.REQUIRES_IMPORTANCE))
def test_importance_required(service, fmt):
    """ggml_quantize_chunk asserts an importance for these types: quantd refuses without one, naming
    the fix, through JSON and raw bodies."""
    status, r = quantize(service, fmt, mk.rows(), None)
    assert status == 422, r
    assert r["error"]["code"] == "bad_importance" and "needs an importance" in r["error"]["message"], r
    req = urllib.request.Request(f"{service}/quantize?fmt={fmt}&dtype=f32&shape=10,512",
                                 data=mk.rows().tobytes(), headers={"Content-Type": "application/octet-stream"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 422 and "needs an importance" in json.loads(e.value.read())["error"]["message"]


def test_importance_refusals(service):
    x = mk.rows()
    imp = mk.importances()["positive"]
    for fmt, vec, what in [("nf4", imp, "takes no importance"), ("q4_K", imp[:256], "one per column"),
                           ("q4_K", np.tile(imp, 3), "equal runs of rows"),
                           ("q4_K", np.where(np.arange(512) == 3, np.nan, imp), "finite"),
                           ("q4_K", -imp, ">= 0"),
                           ("iq1_s", None, "needs an importance")]:  # ggml asserts one
        status, r = quantize(service, fmt, x, vec)
        assert status == 422, (fmt, r)
        assert r["error"]["code"] == "bad_importance" and what in r["error"]["message"], r
