"""Offline checks of the container and cluster files: hadolint on the Dockerfile, its make
targets exist, every manifest (and the rendered overlay) validates against the Kubernetes
OpenAPI schemas, and the manifests agree with the daemon itself: env vars and flags from the
built binary's --help, probe paths and the HPA's metric from a running `quantd serve`."""
import copy
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
QUANTD = os.environ.get("QUANTD", str(ROOT / "bin" / "quantd"))
K8S_VERSION = "1.30.0"


def load_all(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization(dirpath):
    return yaml.safe_load((dirpath / "kustomization.yaml").read_text())


def merge(base, patch):
    """Strategic-merge enough for quantd's patches: maps merge, lists of named maps merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x for x in base + patch):
        out = [copy.deepcopy(x) for x in base]
        for p in patch:
            for i, b in enumerate(out):
                if b["name"] == p["name"]:
                    out[i] = merge(b, p)
                    break
            else:
                out.append(p)
        return out
    return patch


def render(dirpath):
    """Resources of a kustomization with its patches applied (no generators are used)."""
    k = kustomization(dirpath)
    docs = []
    for r in k.get("resources", []):
        p = dirpath / r
        docs += render(p) if p.is_dir() else load_all(p)
    for patch in k.get("patches", []):
        for pd in load_all(dirpath / patch["path"]):
            hits = [i for i, d in enumerate(docs) if d["kind"] == pd["kind"] and d["metadata"]["name"] == pd["metadata"]["name"]]
            assert hits, f"patch {patch['path']} targets no resource"
            docs[hits[0]] = merge(docs[hits[0]], pd)
    return docs


def validate(doc, where):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{where}: {doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")


KUSTOMIZATIONS = [DEPLOY / "base", DEPLOY / "monitoring", DEPLOY / "overlays" / "multi-gpu-node",
                  DEPLOY / "convert-job"]


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(pathlib.Path(os.sys.executable).parent / "hadolint")
    r = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def makefile_targets():
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_./-]+)\s*:(?!=)", text, re.M))
    for line in re.findall(r"^\.PHONY:(.*)$", text, re.M):
        targets.update(line.split())
    return targets


def test_dockerfile_make_targets_exist():
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    used = []
    for run in runs:
        # make as a command (after RUN, && or ;), not the apt package of that name
        for cmd in re.findall(r"(?:^RUN|&&|;)\s*make\s+([^&|;]*)", run):
            used += [w for w in cmd.split() if "=" not in w and not w.startswith("-")]
    assert used, "the Dockerfile builds with make"
    missing = set(used) - makefile_targets()
    assert not missing, f"Dockerfile runs make targets the Makefile lacks: {missing}"
    ci = (ROOT / ".ci" / "run").read_text()
    for t in set(used):  # the image builds with what CI runs (make test runs test-unit)
        assert f"make {t}" in ci or t in ("all", "test-unit"), t


def test_make_help_lists_every_target():
    """`make help` prints the Makefile's list, and the list names every phony target (but the
    dependency probe the others run)."""
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True, check=True).stdout
    listed = set(re.findall(r"^make(?: ([a-z0-9-]+))?", out, re.M))
    phony = set()
    for line in re.findall(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M):
        phony.update(line.split())
    assert phony - {"all", "check-deps"} <= listed and "" in listed, phony - listed


def test_every_version_is_the_version_file():
    """The image label, the manifests' image tags, the API's version and the binary's name one
    version: the VERSION file's (the Makefile bakes it into bin/quantd)."""
    version = (ROOT / "VERSION").read_text().strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    docker = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG VERSION=(\S+)$", docker, re.M).group(1) == version
    assert "org.opencontainers.image.version=${VERSION}" in docker
    for kdir in KUSTOMIZATIONS:
        for image in kustomization(kdir).get("images", []):
            assert image.get("newTag", version) == version, kdir
    assert yaml.safe_load((ROOT / "api" / "openapi.yaml").read_text())["info"]["version"] == version
    out = subprocess.run([QUANTD, "--version"], capture_output=True, text=True, check=True).stdout
    assert out == f"quantd {version}\n"


@pytest.mark.parametrize("kdir", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kustomization_files_exist_and_validate(kdir):
    k = kustomization(kdir)
    for r in k.get("resources", []) + [p["path"] for p in k.get("patches", [])]:
        assert (kdir / r).exists(), f"{kdir}: {r} does not exist"
    for doc in render(kdir):
        validate(doc, kdir.relative_to(ROOT))


def test_a_broken_manifest_is_caught():
    dep = next(d for d in render(DEPLOY / "base") if d["kind"] == "Deployment")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eighty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def base_docs(kind):
    return [d for d in render(DEPLOY / "base") if d["kind"] == kind]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def daemon():
    port = free_port()
    p = subprocess.Popen([QUANTD, "serve", "--backend", "cpu", "--listen", f"127.0.0.1:{port}"],
                         stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1)
            break
        except OSError:
            time.sleep(0.02)
    yield base
    p.terminate()
    assert p.wait(timeout=30) == 0


def test_env_vars_and_flags_are_the_daemons():
    help_text = subprocess.run([QUANTD, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    names = set()
    for cm in base_docs("ConfigMap"):
        names.update(cm["data"])
    container = base_docs("Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    names.update(e["name"] for e in container.get("env", []))
    docker_env = re.findall(r"\b(QUANTD_[A-Z_]+)=", (ROOT / "Dockerfile").read_text())
    for n in names | set(docker_env):
        assert re.search(rf"\b{n}\b", help_text), f"{n} is not a setting of quantd serve"
    for flag in [a for a in container.get("args", []) if a.startswith("--")]:
        assert re.search(rf"(^|\s){re.escape(flag)}\s", help_text), f"{flag} is not a flag of quantd serve"


def test_probes_ports_and_metrics_are_served(daemon):
    dep = base_docs("Deployment")[0]
    pod = dep["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = next(cm["data"]["QUANTD_LISTEN"] for cm in base_docs("ConfigMap") if "QUANTD_LISTEN" in cm["data"])
    assert int(listen.rsplit(":", 1)[1]) in ports.values(), "QUANTD_LISTEN's port is not the container port"
    assert "EXPOSE " + listen.rsplit(":", 1)[1] in (ROOT / "Dockerfile").read_text()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ports or get["port"] in ports.values()
        with urllib.request.urlopen(daemon + get["path"], timeout=5) as r:
            assert r.status == 200, f"{probe} {get['path']}"
    svc = base_docs("Service")[0]
    assert svc["spec"]["ports"][0]["targetPort"] in ports
    ann = pod["metadata"]["annotations"]
    assert int(ann["prometheus.io/port"]) in ports.values()
    metrics = urllib.request.urlopen(daemon + ann["prometheus.io/path"], timeout=5).read().decode()
    exported = set(re.findall(r"^([a-z_:][a-z0-9_:]*)[{ ]", metrics, re.M))
    for hpa in base_docs("HorizontalPodAutoscaler"):
        for m in hpa["spec"]["metrics"]:
            assert m["pods"]["metric"]["name"] in exported, f"HPA scales on {m['pods']['metric']['name']}, not exported"
    rules = yaml.safe_load(load_all(DEPLOY / "monitoring" / "prometheus-adapter-rules.yaml")[0]["data"]["config.yaml"])
    for rule in rules["rules"]:
        series = re.match(r"([a-z_:][a-z0-9_:]*)", rule["seriesQuery"].strip("'\"")).group(1)
        assert series in exported, f"prometheus-adapter reads {series}, not exported"


def test_convert_job_runs_a_real_convert_command():
    job = next(d for d in render(DEPLOY / "convert-job") if d["kind"] == "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][-1] == "convert"
    help_text = subprocess.run([QUANTD, "convert", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in [a for a in c["args"] if a.startswith("--")]:
        assert flag in help_text, f"{flag} is not a flag of quantd convert"
    claims = {v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]}
    assert claims == {d["metadata"]["name"] for d in base_docs("PersistentVolumeClaim")}
    dep = base_docs("Deployment")[0]["spec"]["template"]["spec"]
    mount = dep["containers"][0]["volumeMounts"][0]["mountPath"]
    assert base_docs("ConfigMap")[0]["data"]["QUANTD_DATA_DIR"] == mount
