"""A local stand-in for the parts of the Kubernetes API a TrainJob launcher uses, with a
Kubeflow Trainer that runs each TrainJob's nodes as local processes.

Create, read and delete TrainJobs (trainer.kubeflow.org/v1alpha1), list node 0's pod by its
JobSet labels, read its log. Each node runs the TrainJob's command with the environment the
torch runtime gives it (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
PET_MASTER_PORT): torchrun then rendezvouses the nodes over localhost, as over a cluster's
network. The TrainJob is Complete when every node exits 0, Failed when one does not.

mode "no-crd" answers a create as an API server without the CRD does (404); "refuse" as
Trainer's webhook refuses a TrainJob whose runtime does not exist (422); "unavailable" answers
every create with 503; "conflict" answers every create with 409, as if someone else made the
TrainJob again each time it is deleted; "lost" makes the first TrainJob but loses the reply
(504), then answers every create with 503. `put_earlier` leaves a TrainJob in the way, as
an earlier attempt of the task would. `unavailable`, `unavailable_creates` and
`lost_replies` make the next reads or creates fail transiently (a lost reply: the TrainJob
is created, the answer is a 504).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil
import tenacity
from services import PortTaken, free_port, on_a_free_port, port_taken

TRAINJOBS = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?$"
)
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
WEBHOOK = "validate.trainjob.trainer.kubeflow.org"
POD_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


class StandIn:
    def __init__(self, work: Path, mode: str = "run") -> None:
        self.work = work
        self.mode = mode
        self.created: list[dict[str, Any]] = []
        self.live: set[str] = set()  # TrainJobs created and not deleted
        self.earlier: dict[str, dict[str, Any]] = {}  # TrainJobs there before the test
        self.unavailable = 0  # how many reads of a TrainJob answer 503 first
        self.unavailable_creates = 0  # how many creations answer 503 first
        self.lost_replies = 0  # how many creations that go through answer 504
        self.refused: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.nodes: dict[str, list[subprocess.Popen[bytes]]] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        for processes in self.nodes.values():
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def put_earlier(self, name: str, annotations: dict[str, str]) -> None:
        """A TrainJob of this name already there, as an earlier attempt left it."""
        self.earlier[name] = {"metadata": {"name": name, "annotations": annotations}}
        self.live.add(name)

    # -- the Trainer: nodes as processes -----------------------------------------------------
    def start_nodes(self, body: dict[str, Any]) -> None:
        """Node 0 first, on a free master port, until its torchrun listens there (another
        process may take the port before it binds: then on a fresh port); then the others."""
        name, trainer = body["metadata"]["name"], body["spec"]["trainer"]

        def start() -> tuple[int, subprocess.Popen[bytes]]:
            port = free_port()
            node_0 = self._start_node(name, trainer, 0, port)
            if not _listens_on(node_0, port):
                log = (self.work / f"{name}-node-0.log").read_text(errors="replace")
                if port_taken(log):
                    raise PortTaken(f"{name} node 0: master port {port} was taken")
            return port, node_0  # listening, or failed for a reason of its own: status says

        port, node_0 = on_a_free_port(start)
        others = [self._start_node(name, trainer, n, port) for n in range(1, trainer["numNodes"])]
        self.nodes[name] = [node_0, *others]

    def _start_node(
        self, name: str, trainer: dict[str, Any], node: int, port: int
    ) -> subprocess.Popen[bytes]:
        command = [sys.executable if part == "python" else part for part in trainer["command"]]
        env = {
            **os.environ,
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
        with (self.work / f"{name}-node-{node}.log").open("wb") as log:
            return subprocess.Popen(
                [*command, *trainer["args"]], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def status(self, name: str) -> dict[str, Any]:
        codes = [process.poll() for process in self.nodes.get(name, [])]
        if any(code not in (None, 0) for code in codes):
            reason = {"type": "Failed", "status": "True", "reason": "TrainingFailed"}
            return {"conditions": [{**reason, "message": "a node exited with an error"}]}
        if codes and all(code == 0 for code in codes):
            return {"conditions": [{"type": "Complete", "status": "True", "reason": "Done"}]}
        return {}

    # -- HTTP --------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def reply(self, code: int, body: dict[str, Any] | bytes) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def failure(self, code: int, message: str) -> None:
                self.reply(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": message,
                        "code": code,
                    },
                )

            def do_POST(self) -> None:
                match = TRAINJOBS.match(urlparse(self.path).path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not match or standin.mode == "no-crd":
                    return self.failure(404, "the server could not find the requested resource")
                if standin.mode == "refuse":
                    standin.refused.append(body)
                    runtime = body["spec"]["runtimeRef"]["name"]
                    return self.failure(
                        422,
                        f'admission webhook "{WEBHOOK}" denied the request: '
                        f'ClusterTrainingRuntime.trainer.kubeflow.org "{runtime}" not found',
                    )
                lost = standin.mode == "lost" and not standin.created
                if standin.mode == "lost" and standin.created:
                    return self.failure(503, "the server is currently unable to handle the request")
                if standin.mode == "unavailable" or standin.unavailable_creates:
                    standin.unavailable_creates = max(0, standin.unavailable_creates - 1)
                    return self.failure(503, "the server is currently unable to handle the request")
                name = body["metadata"]["name"]
                # "conflict": someone else makes the TrainJob again each time it is deleted.
                if name in standin.live or standin.mode == "conflict":
                    return self.failure(
                        409, f'trainjobs.trainer.kubeflow.org "{name}" already exists'
                    )
                standin.created.append(body)
                standin.live.add(name)
                standin.start_nodes(body)
                if standin.lost_replies or lost:
                    standin.lost_replies = max(0, standin.lost_replies - 1)
                    return self.failure(504, "the request timed out")
                self.reply(201, body)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if match := TRAINJOBS.match(url.path):
                    name = match[2]
                    if standin.unavailable:
                        standin.unavailable -= 1
                        return self.failure(
                            503, "the server is currently unable to handle the request"
                        )
                    found = [b for b in standin.created if b["metadata"]["name"] == name]
                    if not found and name in standin.earlier:
                        found = [standin.earlier[name]]
                    if not found or name not in standin.live:
                        return self.failure(
                            404, f'trainjobs.trainer.kubeflow.org "{name}" not found'
                        )
                    return self.reply(200, {**found[-1], "status": standin.status(name)})
                if match := PODS.match(url.path):
                    selector = parse_qs(url.query)["labelSelector"][0]
                    name = re.search(r"jobset-name=([^,]+)", selector)[1]  # type: ignore[index]
                    assert (
                        "replicatedjob-name=node" in selector and "completion-index=0" in selector
                    )
                    items = []
                    if name in standin.nodes:
                        code = standin.nodes[name][0].poll()
                        phase = (
                            "Running" if code is None else "Succeeded" if code == 0 else "Failed"
                        )
                        items.append(
                            {
                                "metadata": {"name": f"{name}-node-0-0-abcde"},
                                "status": {"phase": phase},
                            }
                        )
                    return self.reply(200, {"apiVersion": "v1", "kind": "PodList", "items": items})
                if match := POD_LOG.match(url.path):
                    assert parse_qs(url.query).get("container") == ["node"]
                    name = match[2].removesuffix("-node-0-0-abcde")
                    node_0 = standin.nodes[name][0]
                    node_0.wait()  # follow=true: the whole log, once the container ends
                    return self.reply(200, (standin.work / f"{name}-node-0.log").read_bytes())
                self.failure(404, "not found")

            def do_DELETE(self) -> None:
                match = TRAINJOBS.match(urlparse(self.path).path)
                assert match and match[2]
                standin.deleted.append(match[2])
                standin.live.discard(match[2])
                standin.earlier.pop(match[2], None)
                self.reply(200, {"kind": "Status", "status": "Success"})

        return Handler


def _listens_on(process: subprocess.Popen[bytes], port: int, timeout: float = 120) -> bool:
    """Wait until `process` (torchrun's agent: its rendezvous store) listens on `port`;
    False once it has exited without."""

    def listening() -> bool | None:
        if process.poll() is not None:
            return False
        try:
            connections = psutil.Process(process.pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return False
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections):
            return True
        return None  # not yet

    waiting = tenacity.Retrying(
        retry=tenacity.retry_if_result(lambda result: result is None),
        wait=tenacity.wait_fixed(0.05),
        stop=tenacity.stop_after_delay(timeout),
        retry_error_callback=lambda _: False,
    )
    return bool(waiting(listening))
