"""Submit the pipeline to Kubeflow Pipelines, or upload it there, through `kfp.Client`.

`ampbench submit` compiles the pipeline, creates a run from it (in a KFP experiment) and can
wait for the run to finish; `ampbench upload` stores the pipeline, or a new version of it, on
the server. Authentication is a bearer token: `--token-file`, else the service-account token a
pod has (through kfp's own `ServiceAccountTokenVolumeCredentials`, which re-reads the file on
every request, so a token the kubelet rotates during `--wait` stays valid).

Every failure to talk to the server becomes one `AmpbenchError` line that names the host and
what to do; the token is never part of any message.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kfp
import kfp_server_api
import urllib3
from kfp.client import (
    KF_PIPELINES_SA_TOKEN_ENV,
    KF_PIPELINES_SA_TOKEN_PATH,
    ServiceAccountTokenVolumeCredentials,
)
from kfp.client.client import KF_PIPELINES_DEFAULT_EXPERIMENT_NAME, KF_PIPELINES_ENDPOINT_ENV

from ampbench import __version__
from ampbench.argtypes import (
    batch_size_list,
    model_list,
    number,
    positive_number,
    precision_list,
    seed_list,
    whole_number,
)
from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.pipelines.compile import add_build_options

# Where a pod finds a token when --token-file is not given, after $KF_PIPELINES_SA_TOKEN_PATH:
# the token projected for KFP (audience pipelines.kubeflow.org), then the plain service-account
# token.
IN_CLUSTER_TOKEN_PATHS = (
    KF_PIPELINES_SA_TOKEN_PATH,
    "/var/run/secrets/kubernetes.io/serviceaccount/token",
)
DEFAULT_EXPERIMENT = "ampbench"
DEFAULT_POLL_INTERVAL_S = 5.0
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELED")
PORT_FORWARD_HINT = "kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888"


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    run_name: str
    experiment_id: str | None
    url: str
    state: str | None = None  # the last state seen; None when not waited for


@dataclass(frozen=True)
class UploadInfo:
    pipeline_id: str
    pipeline_name: str
    version_id: str | None  # None for a new pipeline: its first version is named after it
    version_name: str | None
    url: str


# -- the client ---------------------------------------------------------------------------------
class _Client(kfp.Client):
    """kfp.Client that knows which host and token it uses, for the error messages.

    Its constructor asks the server's healthz (when no namespace is set); kfp's
    `get_kfp_healthz` tries that 5 times, 5 s apart, logging a traceback each time. Here it is
    tried once, and the error reported as one line.
    """

    ampbench_host: str = ""
    ampbench_token_source: str | None = None
    ampbench_multi_user: bool = False  # as healthz said, when it was asked

    def get_kfp_healthz(self, sleep_duration: int = 5) -> kfp_server_api.V2beta1GetHealthzResponse:
        _refuse_html(self._healthz_api.api_client)  # kfp.Client's constructor calls this first
        health = self.healthzs.healthz_service_get_healthz()
        self.ampbench_multi_user = bool(health.multi_user)
        return health


def make_client(host: str | None, namespace: str | None, token_file: Path | None) -> kfp.Client:
    """A client for the KFP API at `host` (else $KF_PIPELINES_ENDPOINT), with a bearer token.

    The token comes from `token_file`, else from $KF_PIPELINES_SA_TOKEN_PATH or the first
    in-cluster token file that exists; with none, requests go without a token (a port-forward
    to a single-user deployment needs none).
    """
    endpoint = host or os.environ.get(KF_PIPELINES_ENDPOINT_ENV)
    if not endpoint:
        raise AmpbenchError(
            f"no Kubeflow Pipelines host: pass --host URL or set {KF_PIPELINES_ENDPOINT_ENV} "
            f"(e.g. http://localhost:8888 after `{PORT_FORWARD_HINT}`)"
        )
    token: str | None = None
    credentials = None
    if token_file is not None:
        # As existing_token, which kfp ranks first: above its IAP (KF_PIPELINES_IAP_*) logins.
        token_file = token_file.expanduser()
        token = _read_token(token_file, f"--token-file {token_file}")
        source: str | None = f"the token in {token_file}"
    else:
        # A pod's token: kfp's credentials re-read the file on every request, so a token that
        # the kubelet rotates during --wait stays valid.
        token_path, source = _in_cluster_token()
        credentials = ServiceAccountTokenVolumeCredentials(str(token_path)) if token_path else None
    shown = _shown_host(endpoint)
    with _reported(shown, source, "connecting (healthz)", namespace):
        # kfp reads KF_PIPELINES_ENDPOINT itself when host is None, and adds https:// to a
        # host without a scheme (with a warning, which _reported logs as one line).
        client = _Client(
            host=host,
            namespace=namespace or "kubeflow",
            existing_token=token,
            credentials=credentials,
        )
    _refuse_html(client._run_api.api_client)  # one ApiClient serves every service API
    client.ampbench_host = shown
    client.ampbench_token_source = source
    return client


class _HtmlAnswer(Exception):
    """The server answered an HTML page (a login form, a proxy's page), not the API's JSON."""


def _refuse_html(api_client: kfp_server_api.ApiClient) -> None:
    """Make `api_client` raise _HtmlAnswer for an HTML answer instead of reading it as an
    object with every field None (a run with no state, a pipeline list with no pipelines)."""
    if getattr(api_client, "_ampbench_refuses_html", False):
        return
    deserialize = api_client.deserialize

    def checked(response: Any, response_type: Any) -> Any:
        if response_type != "file":
            content_type = str(response.getheader("Content-Type") or "").lower()
            body = response.data if isinstance(response.data, bytes) else b""
            if "html" in content_type or body.lstrip()[:1] == b"<":
                raise _HtmlAnswer(content_type or "HTML")
        return deserialize(response, response_type)

    api_client.deserialize = checked
    api_client._ampbench_refuses_html = True


def _in_cluster_token() -> tuple[Path | None, str | None]:
    """The pod's token file, if any, and how to name it in messages (never the token)."""
    from_env = os.environ.get(KF_PIPELINES_SA_TOKEN_ENV)
    if from_env:
        path = Path(from_env)
        _read_token(path, f"{KF_PIPELINES_SA_TOKEN_ENV}={path}")
        return path, f"the service-account token in {path}"
    for candidate in map(Path, IN_CLUSTER_TOKEN_PATHS):
        if candidate.is_file() and os.access(candidate, os.R_OK):
            return candidate, f"the service-account token in {candidate}"
    return None, None


def _read_token(path: Path, named: str) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise AmpbenchError(f"{named}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise AmpbenchError(f"{named}: not a text file") from None
    if not token:
        raise AmpbenchError(f"{named}: the file is empty")
    return token


def _shown_host(endpoint: str) -> str:
    endpoint = endpoint if endpoint.startswith("http") else f"https://{endpoint}"
    return endpoint.rstrip("/")


def _url(client: kfp.Client, fragment: str) -> str:
    """A link into the KFP UI ($KF_PIPELINES_UI_ENDPOINT, else the host), as kfp prints it."""
    prefix = client._get_url_prefix()
    return f"{prefix}/#/{fragment}"


# -- submitting ---------------------------------------------------------------------------------
def submit_run(
    client: kfp.Client,
    *,
    pipeline_file: Path,
    experiment: str | None,
    run_name: str | None,
    arguments: dict[str, Any],
    namespace: str | None,
    wait: bool,
    timeout: float | None,
    poll_interval: float = DEFAULT_POLL_INTERVAL_S,
) -> RunInfo:
    """Create a run of `pipeline_file` in `experiment` (created if missing); optionally wait.

    experiment: None takes $KF_PIPELINES_DEFAULT_EXPERIMENT_NAME, else "ampbench".
    Waiting ends in SUCCEEDED, or raises AmpbenchError for any other end state or `timeout`.
    """
    experiment = experiment or os.environ.get(KF_PIPELINES_DEFAULT_EXPERIMENT_NAME)
    multi_user = getattr(client, "ampbench_multi_user", False)
    # kfp takes the namespace from its context file or the pod's own, when it finds one.
    if multi_user and not namespace and not client.get_user_namespace():
        raise AmpbenchError(
            f"{_host_of(client)} is a multi-user Kubeflow: pass --namespace with the profile "
            "namespace to run in"
        )
    with _reported_for(client, "submitting the run", namespace):
        result = client.create_run_from_pipeline_package(
            str(pipeline_file),
            arguments=arguments,
            run_name=run_name,
            experiment_name=experiment or DEFAULT_EXPERIMENT,
            namespace=namespace,
        )
    if not result.run_id:
        raise AmpbenchError(_not_the_api(client, "the new run has no id"))
    run = RunInfo(
        run_id=result.run_id,
        run_name=result.run_info.display_name or run_name or result.run_id,
        experiment_id=result.run_info.experiment_id,
        url=_url(client, f"runs/details/{result.run_id}"),
    )
    if not wait:
        return run
    log.info("submitted run '%s' (%s): %s", run.run_name, run.run_id, run.url)
    return wait_for_run(client, run, timeout=timeout, poll_interval=poll_interval)


def wait_for_run(
    client: kfp.Client, run: RunInfo, *, timeout: float | None, poll_interval: float
) -> RunInfo:
    """Poll the run until it ends; AmpbenchError unless it SUCCEEDED.

    Not kfp's `wait_for_run_completion`: that one does not stop on CANCELED.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = None
    while True:
        with _reported_for(client, f"polling run {run.run_id}", None):
            info = client.get_run(run.run_id)
        if info.run_id != run.run_id:  # no run at all: polling it again would never end
            raise AmpbenchError(_not_the_api(client, f"its answer for run {run.run_id} is no run"))
        state = str(info.state or "RUNTIME_STATE_UNSPECIFIED")
        if state != seen:
            log.info("run %s: %s", run.run_id, state)
            seen = state
        if state == "SUCCEEDED":
            return RunInfo(run.run_id, run.run_name, run.experiment_id, run.url, state)
        if state in TERMINAL_STATES:
            reason = _one_line(getattr(info.error, "message", None) or "")
            raise AmpbenchError(
                f"run '{run.run_name}' ({run.run_id}) ended {state}"
                + (f": {reason}" if reason else "")
                + f"; see {run.url}"
            )
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise AmpbenchError(
                f"run '{run.run_name}' ({run.run_id}) is still {state} after {timeout:g} s "
                f"(--timeout); it goes on running: {run.url}"
            )
        time.sleep(poll_interval if deadline is None else min(poll_interval, deadline - now))


# -- uploading ----------------------------------------------------------------------------------
def upload_pipeline(
    client: kfp.Client,
    *,
    pipeline_file: Path,
    name: str,
    version: str | None,
    description: str | None,
    namespace: str | None = None,
) -> UploadInfo:
    """Upload `pipeline_file` as pipeline `name`, or as a new version if `name` exists.

    version: the new version's name (default: name, ampbench version and time). A new
    pipeline's first version is named after the pipeline by the server.
    """
    with _reported_for(client, f"looking up pipeline '{name}'", namespace):
        pipeline_id = _pipeline_id(client, name, namespace)
    if pipeline_id is None:
        if version:
            log.info("'%s' is a new pipeline: its first version takes its name", name)
        with _reported_for(client, f"uploading pipeline '{name}'", namespace):
            pipeline = client.upload_pipeline(
                str(pipeline_file),
                pipeline_name=name,
                description=description,
                namespace=namespace,
            )
        if not pipeline.pipeline_id:
            raise AmpbenchError(_not_the_api(client, "the new pipeline has no id"))
        url = _url(client, f"pipelines/details/{pipeline.pipeline_id}")
        return UploadInfo(pipeline.pipeline_id, name, None, None, url)
    version = version or f"{name} {__version__} {datetime.datetime.now():%Y-%m-%d %H-%M-%S}"
    with _reported_for(client, f"uploading version '{version}' of '{name}'", namespace):
        uploaded = client.upload_pipeline_version(
            str(pipeline_file),
            pipeline_version_name=version,
            pipeline_id=pipeline_id,
            description=description,
        )
    if not uploaded.pipeline_version_id:
        raise AmpbenchError(_not_the_api(client, "the new pipeline version has no id"))
    url = _url(client, f"pipelines/details/{pipeline_id}/version/{uploaded.pipeline_version_id}")
    return UploadInfo(pipeline_id, name, uploaded.pipeline_version_id, version, url)


def _pipeline_id(client: kfp.Client, name: str, namespace: str | None) -> str | None:
    """kfp's `get_pipeline_id`, but within `namespace` (kfp's looks at shared pipelines only)."""
    predicate = {"operation": "EQUALS", "key": "display_name", "stringValue": name}
    found = client.list_pipelines(
        filter=json.dumps({"predicates": [predicate]}), namespace=namespace
    ).pipelines
    if not found:
        return None
    if len(found) > 1:
        # Which one should get the version is not ours to guess: say which they are.
        ids = ", ".join(sorted(str(pipeline.pipeline_id) for pipeline in found))
        raise AmpbenchError(
            f"{len(found)} pipelines are named '{name}' at {_host_of(client)} ({ids}): pass a "
            "--name that no other pipeline has, or delete all but one of them"
        )
    return found[0].pipeline_id


# -- errors -------------------------------------------------------------------------------------
def _host_of(client: kfp.Client) -> str:
    return getattr(client, "ampbench_host", "") or "the Kubeflow Pipelines API"


def _not_the_api(client: kfp.Client, what: str) -> str:
    host = _host_of(client)
    return (
        f"{host} answered, but {what}: is --host the Kubeflow Pipelines API and not a login "
        f"page in front of it? (e.g. http://localhost:8888 after `{PORT_FORWARD_HINT}`)"
    )


@contextlib.contextmanager
def _reported_for(client: kfp.Client, action: str, namespace: str | None) -> Iterator[None]:
    host = _host_of(client)
    with _reported(host, getattr(client, "ampbench_token_source", None), action, namespace):
        yield


@contextlib.contextmanager
def _reported(
    host: str, token_source: str | None, action: str, namespace: str | None
) -> Iterator[None]:
    """Around kfp.Client calls: their failures as one AmpbenchError line; their chatter quiet.

    kfp prints links to stdout (logged here at debug level instead), warns (logged as one
    line), and urllib3 logs a warning per connection retry (silenced: the error says it).
    """
    printed = io.StringIO()
    urllib3_logger = logging.getLogger("urllib3")
    level = urllib3_logger.level
    urllib3_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
            warnings.simplefilter("always")
            try:
                yield
            finally:
                for warning in caught:
                    if "only works with Kubeflow Pipeline" not in str(warning.message):
                        log.warning("%s", _one_line(str(warning.message)))
    except kfp_server_api.ApiException as error:
        raise AmpbenchError(_http_message(error, host, token_source, action, namespace)) from None
    except _HtmlAnswer:
        raise AmpbenchError(
            f"{host} answered an HTML page while {action}, not the Kubeflow Pipelines API: is "
            f"--host the API and not a login page in front of it? (e.g. http://localhost:8888 "
            f"after `{PORT_FORWARD_HINT}`)"
        ) from None
    except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as error:
        raise AmpbenchError(
            f"cannot reach Kubeflow Pipelines at {host} ({_network_reason(error)}) while "
            f"{action}: check --host or {KF_PIPELINES_ENDPOINT_ENV}, and that the API is "
            f"reachable from here (e.g. `{PORT_FORWARD_HINT}`)"
        ) from None
    except OSError as error:
        raise AmpbenchError(f"{action}: {_one_line(str(error))}") from None
    except ValueError as error:  # kfp's own checks: duplicate names, a bad package
        raise AmpbenchError(f"{action} at {host}: {_one_line(str(error))}") from None
    finally:
        urllib3_logger.setLevel(level)
        for line in printed.getvalue().splitlines():
            log.debug("kfp: %s", line)


def _http_message(
    error: kfp_server_api.ApiException,
    host: str,
    token_source: str | None,
    action: str,
    namespace: str | None,
) -> str:
    status = error.status or 0
    if status == 0:  # kfp_server_api's own wrapper for a TLS error
        return f"cannot talk to {host} while {action}: {_one_line(str(error.reason))}"
    said = _server_message(error.body)
    said = "" if said.lower() == str(error.reason).lower() else said
    answer = f"{host} answered {status} {error.reason or ''}".rstrip() + f" while {action}"
    answer += f" ({said})" if said else ""
    if status == 401:
        if token_source is None:
            return (
                f"{answer}: no token was sent; pass --token-file with a token for this "
                "cluster (e.g. from `kubectl create token`)"
            )
        return f"{answer}: {token_source} was not accepted; pass --token-file with a valid token"
    if status == 403:
        where = f"namespace '{namespace}'" if namespace else "this namespace"
        return (
            f"{answer}: the token is valid but has no access to {where}; pass --namespace with "
            "a profile namespace you can use, or a token of an account that has access"
        )
    if status == 404:
        return (
            f"{answer}: check that --host is the Kubeflow Pipelines API (v2beta1), e.g. "
            f"http://localhost:8888 after `{PORT_FORWARD_HINT}`"
        )
    return answer


def _server_message(body: Any) -> str:
    """The server's own explanation: `message` of its google.rpc.Status JSON, else short text."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    text = (data.get("message") or data.get("error") or "") if isinstance(data, dict) else body
    text = _one_line(str(text))
    if text.startswith("<"):  # an HTML page, e.g. a login form
        return ""
    # A bearer token echoed back by some proxy never reaches the terminal.
    text = re.sub(r"(?i)(bearer\s+)\S+", r"\1***", text)
    return text[:200] + ("..." if len(text) > 200 else "")


def _network_reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None) or error
    found = re.search(r"\[Errno -?\d+\] ([^)'\"]+)", str(reason))
    if found:
        return found.group(1).strip().lower()
    if isinstance(reason, urllib3.exceptions.ConnectTimeoutError | TimeoutError):
        return "timed out"
    return type(reason).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- parameters from the pipeline ---------------------------------------------------------------
@dataclass(frozen=True)
class PipelineParameter:
    """One input of the pipeline function, as the compiled pipeline declares it."""

    name: str
    type: str  # kfp's type name: String, Integer, Float, Boolean, List, Dict
    default: Any
    description: str | None

    @property
    def dest(self) -> str:
        return f"pipeline_param_{self.name}"


# Flags named otherwise than the parameter: `experiment` is MLflow's, not KFP's.
RENAMED_FLAGS = {"experiment": "mlflow-experiment"}


def pipeline_parameters() -> list[PipelineParameter]:
    """The pipeline's parameters (not artifacts), in the order of its signature."""
    from ampbench.pipelines.pipeline import build_pipeline

    inputs = build_pipeline().component_spec.inputs or {}
    return [
        PipelineParameter(name, spec.type, spec.default, spec.description)
        for name, spec in inputs.items()
        if spec.type in _KINDS
    ]


def pipeline_description() -> str | None:
    from ampbench.pipelines.pipeline import build_pipeline

    return build_pipeline().description


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _list_parser(default: Any) -> Callable[[str], list]:
    """A comma-separated list (0,1,2) or a JSON list; of integers when the default is."""
    integers = isinstance(default, list) and bool(default)
    integers = integers and all(type(item) is int for item in default)

    def parse(text: str) -> list:
        text = text.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{text}' is not a JSON list") from None
        else:
            items = [_scalar(part.strip()) for part in text.split(",") if part.strip()]
        if integers and not all(type(item) is int for item in items):
            raise argparse.ArgumentTypeError(f"'{text}' is not a list of integers, e.g. 0,1,2")
        return items

    return parse


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"'{text}' is not a JSON object")
    return value


_KINDS = {
    "String": "text",
    "Integer": "integer",
    "Float": "number",
    "Boolean": "true/false",
    "List": "comma-separated or JSON list",
    "Dict": "JSON object",
}


def _add_pipeline_options(
    parser: argparse.ArgumentParser, parameters: list[PipelineParameter]
) -> None:
    group = parser.add_argument_group(
        "pipeline parameters",
        "Only those given are sent; the others keep the compiled pipeline's defaults.",
    )
    taken = {option for action in parser._actions for option in action.option_strings}
    for parameter in parameters:
        flag = "--" + RENAMED_FLAGS.get(parameter.name, parameter.name.replace("_", "-"))
        if flag in taken:
            flag = "--param-" + parameter.name.replace("_", "-")
        described = (parameter.description or f"pipeline parameter {parameter.name}").rstrip(".")
        shown = json.dumps(parameter.default) if parameter.type != "String" else parameter.default
        text = f"{described} ({_KINDS[parameter.type]}; pipeline default: {shown})"
        options: dict[str, Any] = {
            "dest": parameter.dest,
            "default": argparse.SUPPRESS,
            "help": text.replace("%", "%%"),
        }
        if parameter.type == "Boolean":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["metavar"] = flag.removeprefix("--").replace("-", "_").upper()
            options["type"] = {
                "String": str,
                "Integer": whole_number,
                "Float": number,
                "List": _list_parser(parameter.default),
                "Dict": _json_object,
            }[parameter.type]
        group.add_argument(flag, **options)
        taken.add(flag)


# -- the commands -------------------------------------------------------------------------------
def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    connection = parser.add_argument_group("Kubeflow Pipelines")
    connection.add_argument(
        "--host",
        help=f"the KFP API endpoint, e.g. http://localhost:8888 (default: "
        f"${KF_PIPELINES_ENDPOINT_ENV})",
    )
    connection.add_argument("--namespace", help="profile namespace (multi-user deployments)")
    connection.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="a file holding the bearer token (default: the pod's service-account token, "
        f"${KF_PIPELINES_SA_TOKEN_ENV} or {KF_PIPELINES_SA_TOKEN_PATH}, if there is one)",
    )


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Register `submit` and `upload` on the `ampbench` command's subparsers."""
    submit = commands.add_parser(
        "submit",
        help="run the pipeline on Kubeflow Pipelines",
        description="Compile the pipeline and start a run of it on a Kubeflow Pipelines "
        "server, in a KFP experiment; with --wait, follow it until it ends.",
    )
    _add_connection_options(submit)
    run = submit.add_argument_group("the run")
    run.add_argument(
        "--experiment",
        help=f"KFP experiment, created if missing (default: ${KF_PIPELINES_DEFAULT_EXPERIMENT_NAME}"
        f" or {DEFAULT_EXPERIMENT}); the MLflow experiment is --mlflow-experiment",
    )
    run.add_argument("--run-name", help="default: ampbench and the date and time")
    run.add_argument(
        "--wait", action="store_true", help="wait for the run; fail unless it succeeds"
    )
    run.add_argument(
        "--timeout", type=positive_number, metavar="S", help="with --wait: give up after S s"
    )
    run.add_argument(
        "--poll-interval",
        type=positive_number,
        default=DEFAULT_POLL_INTERVAL_S,
        metavar="S",
        help="with --wait: seconds between polls",
    )
    add_build_options(submit)
    matrix = submit.add_argument_group(
        "experiment matrix",
        "Make the `runs` parameter: every model x batch size x precision x seed, each (model, "
        "batch size) group with its own baseline arm; a list not given keeps the default "
        "experiment's single value.",
    )
    matrix.add_argument("--models", type=model_list, metavar="LIST", help="e.g. resnet18,vit-s")
    matrix.add_argument("--batch-sizes", type=batch_size_list, metavar="LIST", help="e.g. 128,512")
    matrix.add_argument(
        "--precisions", type=precision_list, metavar="LIST", help="e.g. tf32,fp16,bf16"
    )
    matrix.add_argument("--seeds", type=seed_list, metavar="LIST", help="e.g. 0,1,2")
    parameters = pipeline_parameters()
    _add_pipeline_options(submit, parameters)
    submit.set_defaults(handler=_submit, pipeline_parameters=parameters)

    upload = commands.add_parser(
        "upload",
        help="store the pipeline (or a new version of it) on Kubeflow Pipelines",
        description="Compile the pipeline and upload it to a Kubeflow Pipelines server: a new "
        "pipeline, or a new version of the pipeline of that name.",
    )
    _add_connection_options(upload)
    from ampbench.pipelines.pipeline import PIPELINE_NAME

    upload.add_argument("--name", default=PIPELINE_NAME, help="pipeline name")
    upload.add_argument(
        "--version",
        dest="version_name",
        metavar="VERSION",
        help="name of the new version of an existing pipeline (default: the pipeline name, "
        "ampbench version, date and time)",
    )
    upload.add_argument("--description", help="default: the pipeline's own description")
    add_build_options(upload)
    upload.set_defaults(handler=_upload)


def _submit(args: argparse.Namespace) -> int:
    from ampbench.matrix import matrix_runs
    from ampbench.pipelines.compile import compile_pipeline
    from ampbench.preflight import PLAN_PARAMETERS, Plan, preflight

    if args.timeout is not None and not args.wait:
        raise AmpbenchError("--timeout applies to --wait only")
    arguments = {
        parameter.name: getattr(args, parameter.dest)
        for parameter in args.pipeline_parameters
        if hasattr(args, parameter.dest)
    }
    defaults = {parameter.name: parameter.default for parameter in args.pipeline_parameters}
    lists = {"models": args.models, "batch_sizes": args.batch_sizes}
    lists |= {"precisions": args.precisions, "seeds": args.seeds}
    if any(value is not None for value in lists.values()):
        if "runs" in arguments:
            raise AmpbenchError("--runs and --models/--batch-sizes/--precisions/--seeds: give one")
        first = defaults["runs"][0]
        arguments["runs"] = matrix_runs(
            lists["models"] or [first["model"]],
            lists["batch_sizes"] or [first["batch_size"]],
            lists["precisions"] or [run["precision"] for run in defaults["runs"]],
            lists["seeds"] or [first["seed"]],
            arguments.get("baseline_precision", defaults["baseline_precision"]),
        )
    settings = {**defaults, **{k: v for k, v in arguments.items() if v is not None}}
    plan = Plan(**{name: settings[name] for name in PLAN_PARAMETERS})
    preflight(plan, "submit")
    client = make_client(args.host, args.namespace, args.token_file)
    run_name = args.run_name or f"ampbench {datetime.datetime.now():%Y-%m-%d %H-%M-%S}"
    with tempfile.TemporaryDirectory(prefix="ampbench-submit-") as tmp:
        package = compile_pipeline(Path(tmp) / "ampbench.yaml", args.image, args.schedule)
        run = submit_run(
            client,
            pipeline_file=package,
            experiment=args.experiment,
            run_name=run_name,
            arguments=arguments,
            namespace=args.namespace,
            wait=args.wait,
            timeout=args.timeout,
            poll_interval=args.poll_interval,
        )
    if run.state is None:
        print(f"submitted run '{run.run_name}' ({run.run_id}): {run.url}")
    else:
        print(f"run '{run.run_name}' ({run.run_id}) {run.state}: {run.url}")
    return 0


def _upload(args: argparse.Namespace) -> int:
    from ampbench.pipelines.compile import compile_pipeline

    client = make_client(args.host, args.namespace, args.token_file)
    with tempfile.TemporaryDirectory(prefix="ampbench-upload-") as tmp:
        package = compile_pipeline(Path(tmp) / "ampbench.yaml", args.image, args.schedule)
        uploaded = upload_pipeline(
            client,
            pipeline_file=package,
            name=args.name,
            version=args.version_name,
            description=args.description or pipeline_description(),
            namespace=args.namespace,
        )
    if uploaded.version_id is None:
        print(
            f"uploaded pipeline '{uploaded.pipeline_name}' ({uploaded.pipeline_id}): {uploaded.url}"
        )
    else:
        print(
            f"uploaded version '{uploaded.version_name}' ({uploaded.version_id}) of pipeline "
            f"'{uploaded.pipeline_name}' ({uploaded.pipeline_id}): {uploaded.url}"
        )
    return 0
