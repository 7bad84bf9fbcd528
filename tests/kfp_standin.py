"""A local stand-in for the Kubeflow Pipelines v2beta1 REST API, for the calls kfp 2.17 makes.

It serves, on 127.0.0.1 and a free port, only what `kfp.Client` calls to submit a run, wait
for it and upload a pipeline (paths and JSON shapes from `kfp_server_api`'s generated
`*_service_api.py` and `models/`):

    GET  /apis/v2beta1/healthz                      -> V2beta1GetHealthzResponse
    GET  /apis/v2beta1/experiments?filter=&namespace= -> V2beta1ListExperimentsResponse
    POST /apis/v2beta1/experiments                  -> V2beta1Experiment
    GET  /apis/v2beta1/experiments/{id}             -> V2beta1Experiment
    POST /apis/v2beta1/runs                         -> V2beta1Run
    GET  /apis/v2beta1/runs/{id}                    -> V2beta1Run
    GET  /apis/v2beta1/pipelines?filter=&namespace= -> V2beta1ListPipelinesResponse
    POST /apis/v2beta1/pipelines/upload?name=&description=&namespace=   (multipart uploadfile)
                                                    -> V2beta1Pipeline
    POST /apis/v2beta1/pipelines/upload_version?name=&pipelineid=&description=  (multipart)
                                                    -> V2beta1PipelineVersion

Every request is recorded (method, path, query, headers, body). `fail(status, ...)` makes
matching requests answer an error the way the KFP API server does (a google.rpc.Status JSON
body); `login_page(...)` makes them answer 200 with an HTML sign-in form, as an
authenticating proxy in front of the API does; anything else answers 404.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

API = "/apis/v2beta1"
CREATED_AT = "2025-01-01T00:00:00Z"
# google.rpc codes that grpc-gateway maps to these HTTP statuses.
GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13, 503: 14}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def files(self) -> dict[str, bytes]:
        """The parts of a multipart/form-data body, by field name."""
        head = f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self.body)
        return {
            part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
            for part in message.iter_parts()
        }


@dataclass
class _Failure:
    status: int
    method: str | None
    path: str | None
    message: str
    html: bool = False  # answer LOGIN_PAGE (text/html) instead of a google.rpc.Status


LOGIN_PAGE = (
    '<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body><form method="post" '
    'action="/dex/auth/local/login"><input name="login"><input name="password" type="password">'
    "</form></body></html>\n"
)


@dataclass(frozen=True)
class Html:
    """A payload sent as text/html, not as JSON."""

    text: str


@dataclass
class KfpStandIn:
    """Start with `with KfpStandIn() as kfp:`; `kfp.url` is the host to give the client.

    run_states: the states that GET runs/{id} answers, one per poll, the last one repeated.
    """

    run_states: list[str] = field(default_factory=lambda: ["RUNNING", "SUCCEEDED"])
    run_error: str = "train-amp: CUDA out of memory"
    multi_user: bool = False
    requests: list[Request] = field(default_factory=list)
    experiments: dict[str, dict] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)
    pipelines: dict[str, dict] = field(default_factory=dict)
    versions: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._failures: list[_Failure] = []
        self._polls: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- control ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "the stand-in is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail(
        self,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        message: str | None = None,
    ) -> None:
        """Answer `status` to requests of `method` (any if None) whose path starts with `path`."""
        text = message or HTTPStatus(status).phrase
        self._failures.append(_Failure(status, method, path, text))

    def login_page(self, *, method: str | None = None, path: str | None = None) -> None:
        """Answer 200 and an HTML sign-in page to requests of `method` (any if None) whose path
        starts with `path` (any if None): a login proxy in front of the API."""
        self._failures.append(_Failure(200, method, path, "", html=True))

    def matching(self, method: str, path: str) -> list[Request]:
        """The recorded requests of `method` to `path` (without the query)."""
        return [r for r in self.requests if r.method == method and r.path == path]

    def __enter__(self) -> KfpStandIn:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- the API ------------------------------------------------------------------------------
    def _new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids):04d}"

    def handle(self, request: Request) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(request)
            for failure in self._failures:
                if (failure.method in (None, request.method)) and request.path.startswith(
                    failure.path or ""
                ):
                    if failure.html:
                        return failure.status, Html(LOGIN_PAGE)
                    return failure.status, _status_body(failure.status, failure.message)
            return self._route(request)

    def _route(self, r: Request) -> tuple[int, Any]:
        route = (r.method, r.path.removeprefix(API))
        parts = route[1].strip("/").split("/")
        if route == ("GET", "/healthz"):
            return 200, {"multi_user": self.multi_user, "pipeline_store": "database"}
        if route == ("GET", "/experiments"):
            return 200, _listing("experiments", _filtered(self.experiments.values(), r))
        if route == ("POST", "/experiments"):
            return self._create_experiment(r.json())
        if r.method == "GET" and len(parts) == 2 and parts[0] == "experiments":
            return _found(self.experiments, parts[1], "experiment")
        if route == ("POST", "/runs"):
            return self._create_run(r.json())
        if r.method == "GET" and len(parts) == 2 and parts[0] == "runs":
            return self._get_run(parts[1])
        if route == ("GET", "/pipelines"):
            return 200, _listing("pipelines", _filtered(self.pipelines.values(), r))
        if route == ("POST", "/pipelines/upload"):
            return self._upload(r)
        if route == ("POST", "/pipelines/upload_version"):
            return self._upload_version(r)
        return 404, _status_body(404, f"the stand-in does not serve {r.method} {r.path}")

    def _create_experiment(self, body: dict) -> tuple[int, Any]:
        name = body.get("display_name")
        if not name:
            return 400, _status_body(400, "experiment display_name is empty")
        if any(e["display_name"] == name for e in self.experiments.values()):
            return 409, _status_body(409, f"experiment {name} already exists")
        experiment = {
            **body,
            "experiment_id": self._new_id("experiment"),
            "created_at": CREATED_AT,
            "storage_state": "AVAILABLE",
        }
        self.experiments[experiment["experiment_id"]] = experiment
        return 200, experiment

    def _create_run(self, body: dict) -> tuple[int, Any]:
        if body.get("experiment_id") not in self.experiments:
            return 404, _status_body(404, f"experiment {body.get('experiment_id')} not found")
        run = {
            **body,
            "run_id": self._new_id("run"),
            "created_at": CREATED_AT,
            "storage_state": "AVAILABLE",
            "state": "PENDING",
        }
        self.runs[run["run_id"]] = run
        return 200, run

    def _get_run(self, run_id: str) -> tuple[int, Any]:
        if run_id not in self.runs:
            return 404, _status_body(404, f"run {run_id} not found")
        poll = self._polls.get(run_id, 0)
        self._polls[run_id] = poll + 1
        state = self.run_states[min(poll, len(self.run_states) - 1)]
        run = {**self.runs[run_id], "state": state}
        if state == "FAILED":
            run["error"] = {"code": 2, "message": self.run_error}
        if state in ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"):
            run["finished_at"] = CREATED_AT
        return 200, run

    def _upload(self, r: Request) -> tuple[int, Any]:
        package = r.files().get("uploadfile")
        name = r.param("name") or r.param("display_name")
        if not package or not name:
            return 400, _status_body(400, "an upload needs a name and an uploadfile")
        if any(p["display_name"] == name for p in self.pipelines.values()):
            return 409, _status_body(409, f"pipeline {name} already exists")
        pipeline = {
            "pipeline_id": self._new_id("pipeline"),
            "display_name": name,
            "name": name,
            "description": r.param("description") or "",
            "created_at": CREATED_AT,
        }
        if r.param("namespace"):
            pipeline["namespace"] = r.param("namespace")
        self.pipelines[pipeline["pipeline_id"]] = pipeline
        self._add_version(pipeline["pipeline_id"], name, pipeline["description"], package)
        return 200, pipeline

    def _upload_version(self, r: Request) -> tuple[int, Any]:
        package = r.files().get("uploadfile")
        name = r.param("name") or r.param("display_name")
        pipeline_id = r.param("pipelineid")
        if not package or not name or not pipeline_id:
            return 400, _status_body(400, "a version needs a name, a pipelineid, an uploadfile")
        if pipeline_id not in self.pipelines:
            return 404, _status_body(404, f"pipeline {pipeline_id} not found")
        taken = {
            v["display_name"] for v in self.versions.values() if v["pipeline_id"] == pipeline_id
        }
        if name in taken:
            return 409, _status_body(409, f"pipeline version {name} already exists")
        return 200, self._add_version(pipeline_id, name, r.param("description") or "", package)

    def _add_version(self, pipeline_id: str, name: str, description: str, package: bytes) -> dict:
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": self._new_id("version"),
            "display_name": name,
            "name": name,
            "description": description,
            "created_at": CREATED_AT,
        }
        self.versions[version["pipeline_version_id"]] = {**version, "package": package}
        return version


def _status_body(status: int, message: str) -> dict:
    return {"error": message, "code": GRPC_CODES.get(status, 2), "message": message, "details": []}


def _listing(key: str, items: list[dict]) -> dict:
    # Like the server's JSON marshaller: an empty list is left out, not sent as [].
    return {key: items, "total_size": len(items)} if items else {"total_size": 0}


def _found(table: dict[str, dict], key: str, kind: str) -> tuple[int, Any]:
    if key in table:
        return 200, table[key]
    return 404, _status_body(404, f"{kind} {key} not found")


def _filtered(items: Iterator[dict] | Any, r: Request) -> list[dict]:
    """Apply a `filter` of EQUALS predicates (as kfp.Client writes them) and `namespace`."""
    result = list(items)
    raw = r.param("filter")
    for predicate in json.loads(raw)["predicates"] if raw else []:
        if predicate.get("operation") not in (1, "EQUALS"):
            raise ValueError(f"the stand-in only filters on EQUALS, not {predicate}")
        key, value = predicate["key"], predicate.get("stringValue", predicate.get("string_value"))
        result = [item for item in result if item.get(key) == value]
    namespace = r.param("namespace")
    if namespace:
        result = [item for item in result if item.get("namespace", namespace) == namespace]
    return result


def _handler_for(standin: KfpStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            split = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(
                method=self.command,
                path=split.path,
                query=parse_qs(split.query, keep_blank_values=True),
                headers={name.lower(): value for name, value in self.headers.items()},
                body=self.rfile.read(length) if length else b"",
            )
            try:
                status, payload = standin.handle(request)
            except Exception as error:  # a bug in the stand-in: answer it, do not hang
                status, payload = 500, _status_body(500, f"stand-in error: {error!r}")
            if isinstance(payload, Html):
                data, content_type = payload.text.encode(), "text/html; charset=utf-8"
            else:
                data, content_type = json.dumps(payload).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean; the requests are recorded instead

    return Handler


@contextmanager
def running(**options: Any) -> Iterator[KfpStandIn]:
    with KfpStandIn(**options) as standin:
        yield standin
