"""Split GGUF models in quantd convert, against llama.cpp's own files
(tests/fixtures/gguf_options/llama_quantize.json, made by make_gguf_option_fixtures.py):
- a model given as its first shard (llama-gguf-split's NAME-00001-of-0000N.gguf) is read as one
  model, as llama-quantize reads it: the file it writes, byte for byte, plainly and with
  --keep-split (every file, named as llama-quantize names them);
- --split-max-tensors / --split-max-size write llama-gguf-split's own cut of llama-quantize's file;
- a missing, misnamed or foreign shard is refused with the shard's file name and what to do;
- the same through a conversion job (keep_split) and POST /convert's refusals.
The shards are written by tests/checkpoint/split_gguf.py, whose files are first checked against
the hashes of llama-gguf-split's."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, QUANTD, ROOT, run_quantd

with open(os.path.join(FIXTURES, "gguf_options", "llama_quantize.json")) as f:
    FIX = json.load(f)
CHECKPOINT = os.path.join(ROOT, "tests", "checkpoint")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def split_args(opts):
    """llama-gguf-split's options as split_gguf.py's."""
    name, value = opts
    if name == "--split-max-tensors":
        return ["--tensors", value]
    return ["--size", str(int(value[:-1]) * (10 ** 6 if value[-1] == "M" else 10 ** 9))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny models, importance matrices and split models the cases name, each checked
    against the fixtures' hashes (the split models against llama-gguf-split's shards)."""
    d = tmp_path_factory.mktemp("split")
    made = {"DIR": d}
    needed = {s["model"] for s in FIX["splits"].values()} | {"llama"}
    for name in needed:
        script, *args = FIX["models"][name]
        made[name] = d / f"{name}.gguf"
        subprocess.run([sys.executable, os.path.join(CHECKPOINT, script), str(made[name]), *args], check=True)
        assert sha256(made[name]) == FIX["inputs"][name], f"{name}: another input than the fixtures': remake them"
    for name, (model, kind) in FIX["imatrices"].items():
        if model in needed:
            subprocess.run([sys.executable, os.path.join(CHECKPOINT, "tiny_imatrix.py"), str(made[model]),
                            str(d / name), kind], check=True)
            assert sha256(d / name) == FIX["inputs"][name]
    (d / "splits").mkdir()
    for name, split in FIX["splits"].items():
        subprocess.run([sys.executable, os.path.join(CHECKPOINT, "split_gguf.py"), str(made[split["model"]]),
                        str(d / "splits" / name), *split_args(split["options"])], check=True)
        files = sorted(p.name for p in (d / "splits").glob(f"{name}-*.gguf"))
        assert files == sorted(split["files"]), files
        for f in files:
            assert sha256(d / "splits" / f) == split["files"][f], f"{f}: not llama-gguf-split's shard"
        made[name] = d / "splits" / files[0]
    return made


def written(directory):
    return {p.name: sha256(p) for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("key", sorted(FIX["split_cases"]))
def test_split_input_equals_llama_quantize(models, tmp_path, key):
    """The first shard in: llama-quantize's files out (one, or with --keep-split one per shard,
    DST-0000K-of-0000N.gguf), byte for byte."""
    case = FIX["split_cases"][key]
    out = tmp_path / "q"
    out.mkdir()
    p = subprocess.run([QUANTD, "convert", "--in", models[case["model"]], "--out", out / "out.gguf",
                        *case["options"], "--recipe", case["mix"]], capture_output=True, text=True, cwd=models["DIR"])
    assert p.returncode == 0, p.stderr
    assert written(out) == case["files"], key


@pytest.mark.parametrize("key", sorted(FIX["split_outputs"]))
def test_split_output_equals_gguf_split(models, tmp_path, key):
    """--split-max-tensors / --split-max-size: llama-gguf-split --split of llama-quantize's file,
    every shard byte for byte."""
    split = FIX["split_outputs"][key]
    case = FIX["cases"][split["case"]]
    run_quantd("convert", "--in", models[case["model"]], "--out", tmp_path / f"{key}.gguf", *split["options"],
               *case["options"], "--recipe", case["mix"])
    assert written(tmp_path) == split["files"]


def shards_of(models, name, tmp_path):
    """A copy of split model name's shards in tmp_path; their paths in order."""
    src = models[name].parent
    out = []
    for f in sorted(FIX["splits"][name]["files"]):
        shutil.copy(src / f, tmp_path / f)
        out.append(tmp_path / f)
    return out


def refused(src, tmp_path, *args):
    p = run_quantd("convert", "--in", src, "--out", tmp_path / "out.gguf", *args, "--recipe", "Q4_0", check=False)
    assert p.returncode == 1, p.stderr
    assert str(tmp_path) not in p.stderr.replace(str(src), ""), p.stderr  # the shards by their names
    assert not any(x.name.startswith("out") for x in tmp_path.iterdir())
    return p.stderr


def test_missing_shard(models, tmp_path):
    shards = shards_of(models, "llama-split4", tmp_path)
    shards[2].unlink()
    err = refused(shards[0], tmp_path)
    assert "shard llama-split4-00003-of-00004.gguf (3 of 4) is missing" in err and "llama-gguf-split --merge" in err


def test_not_the_first_shard(models, tmp_path):
    shards = shards_of(models, "llama-split4", tmp_path)
    err = refused(shards[1], tmp_path)
    assert "llama-split4-00002-of-00004.gguf is shard 2 of 4: give the first (NAME-00001-of-00004.gguf)" in err


def test_misnamed_first_shard(models, tmp_path):
    shards = shards_of(models, "llama-split4", tmp_path)
    renamed = tmp_path / "model.gguf"
    shards[0].rename(renamed)
    err = refused(renamed, tmp_path)
    assert "model.gguf is the first of 4 shards (split.count 4) but is not named NAME-00001-of-00004.gguf" in err


def test_shard_of_another_split(models, tmp_path):
    """A shard whose split.no is another's, and one from another model's split (same count and
    number: the tensors do not add up)."""
    shards = shards_of(models, "llama-split4", tmp_path)
    shutil.copy(shards[2], shards[1])
    err = refused(shards[0], tmp_path)
    assert "shard llama-split4-00002-of-00004.gguf does not belong with llama-split4-00001-of-00004.gguf (its " \
           "split.no says shard 3)" in err
    other = shards_of(models, "qwen3moe-split", tmp_path)
    shutil.copy(other[1], shards[1])
    err = refused(shards[0], tmp_path)
    assert "llama-split4-00001-of-00004.gguf says split.tensors.count 30, but its 4 shards hold" in err


def test_keep_split_refusals(models, tmp_path):
    p = run_quantd("convert", "--in", models["llama-split4"], "--out", tmp_path / "o.gguf", "--keep-split",
                   "--split-max-tensors", "8", "--recipe", "Q4_0", check=False)
    assert p.returncode == 2 and "give --keep-split (the input's shards) or --split-max-tensors" in p.stderr, p.stderr
    # shard 2 holds blk.0.ffn_up, blk.0.ffn_down and blk.1.*: pruning blocks 0 and 1 leaves it empty
    p = run_quantd("convert", "--in", models["llama-split4"], "--out", tmp_path / "o.gguf", "--keep-split",
                   "--prune-layers", "0,1", "--recipe", "Q4_0", check=False)
    assert p.returncode == 1 and "--keep-split: no tensor of shard 2 is left" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_keep_split_never_replaces_the_input(models, tmp_path):
    """--keep-split's names from the output's path are the input's own: refused, --force or not."""
    shards = shards_of(models, "llama-split4", tmp_path)
    before = [sha256(s) for s in shards]
    for force in ([], ["--force"]):
        p = run_quantd("convert", "--in", shards[0], "--out", tmp_path / "llama-split4.gguf", "--keep-split", *force,
                       "--recipe", "Q4_0", check=False)
        assert p.returncode == 1 and "is the input's shard" in p.stderr, p.stderr
    assert [sha256(s) for s in shards] == before and len(list(tmp_path.iterdir())) == 4


def test_dry_run_of_a_split_model(models):
    case = FIX["split_cases"]["split_in_q4_k_m"]
    p = run_quantd("convert", "--in", models["llama-split4"], "--dry-run", "--recipe", case["mix"])
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    assert lines[-1]["summary"]["dry_run"] is True and len(lines) == 31


@pytest.fixture(scope="module")
def service(models, tmp_path_factory):
    """quantd serve, its --data-dir holding the split llama (and a copy lacking a shard)."""
    import socket
    import time
    import urllib.request
    data = tmp_path_factory.mktemp("data")
    (data / "gone").mkdir()
    for f in FIX["splits"]["llama-split4"]["files"]:
        shutil.copy(models["llama-split4"].parent / f, data / f)
        if "00002-of" not in f:
            shutil.copy(models["llama-split4"].parent / f, data / "gone" / f)
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
        except Exception:
            time.sleep(0.05)
    yield base, data
    p.terminate()
    assert p.wait(timeout=30) == 0


def http(method, url, body=None):
    import urllib.error
    import urllib.request
    ct = "application/json" if method == "POST" and url.rstrip("/").find("/jobs") >= 0 else "application/octet-stream"
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": ct})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def run_job(base, body):
    import time
    status, r = http("POST", base + "/jobs?op=convert", json.dumps(body).encode())
    assert status == 202, r
    job = json.loads(r)["id"]
    for _ in range(600):
        status, r = http("GET", f"{base}/jobs/{job}/result")
        if status != 409:
            return status, json.loads(r)
        time.sleep(0.05)
    raise AssertionError("the job did not finish")


@pytest.mark.parametrize("key", ["split_in_q4_k_m", "split_in_keep_q4_k_m"])
def test_job_reads_a_split_model(service, key):
    """A job's source is the first shard; keep_split (true) writes llama-quantize's files."""
    base, data = service
    case = FIX["split_cases"][key]
    body = {"source": "llama-split4-00001-of-00004.gguf", "destination": f"{key}/out.gguf", "recipe": case["mix"]}
    if "--keep-split" in case["options"]:
        body["keep_split"] = True
    (data / key).mkdir()
    status, r = run_job(base, body)
    assert status == 200, r
    assert written(data / key) == case["files"]


def test_job_missing_shard(service):
    """A 404 naming the missing shard by its name, none of the server's paths."""
    base, data = service
    status, r = run_job(base, {"source": "gone/llama-split4-00001-of-00004.gguf", "destination": "gone/o.gguf",
                               "recipe": "Q4_0"})
    msg = r["error"]["message"]
    assert status == 404 and "shard llama-split4-00002-of-00004.gguf (2 of 4) is missing" in msg, r
    assert str(data) not in msg and not (data / "gone" / "o.gguf").exists()


def test_convert_route_refuses_a_shard(service):
    """POST /convert takes one file: a first shard is refused with what to do, keep_split too."""
    base, data = service
    body = (data / "llama-split4-00001-of-00004.gguf").read_bytes()
    status, r = http("POST", base + "/convert?recipe=Q4_0", body)
    msg = json.loads(r)["error"]["message"]
    assert status == 400 and "shard 1 of a split model of 4 files" in msg and "llama-gguf-split --merge" in msg, msg
    assert ".quantd-upload" not in msg and str(data) not in msg
    status, r = http("POST", base + "/convert?recipe=Q4_0", (data / "llama-split4-00003-of-00004.gguf").read_bytes())
    msg = json.loads(r)["error"]["message"]
    assert status == 400 and "shard 3 of a split model of 4 files" in msg and ".quantd-upload" not in msg, msg
    status, r = http("POST", base + "/convert?recipe=Q4_0&keep_split=true", body)
    assert status == 400 and "give keep_split to a conversion job" in json.loads(r)["error"]["message"], r
