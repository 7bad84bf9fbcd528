"""Talk to Kubeflow Pipelines: a `kfp.Client` with a bearer token, and its failures as one line.

Authentication is a bearer token: `--token-file`, else the service-account token a pod has
(through kfp's own `ServiceAccountTokenVolumeCredentials`, which re-reads the file on every
request, so a token the kubelet rotates during `--wait` stays valid).

Every failure to talk to the server becomes one `AmpbenchError` line that names the host and
what to do; the token is never part of any message.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator
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
from kfp.client.client import KF_PIPELINES_ENDPOINT_ENV

from ampbench.errors import AmpbenchError, one_line
from ampbench.logs import log

# A pod's tokens without --token-file, after $KF_PIPELINES_SA_TOKEN_PATH: the one projected for
# KFP (audience pipelines.kubeflow.org), then the plain service-account token.
IN_CLUSTER_TOKEN_PATHS = (
    KF_PIPELINES_SA_TOKEN_PATH,
    "/var/run/secrets/kubernetes.io/serviceaccount/token",
)
PORT_FORWARD_HINT = "kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888"


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


def ui_url(client: kfp.Client, fragment: str) -> str:
    """A link into the KFP UI ($KF_PIPELINES_UI_ENDPOINT, else the host), as kfp prints it."""
    prefix = client._get_url_prefix()
    return f"{prefix}/#/{fragment}"


# -- errors -------------------------------------------------------------------------------------
def host_of(client: kfp.Client) -> str:
    return getattr(client, "ampbench_host", "") or "the Kubeflow Pipelines API"


def not_the_api(client: kfp.Client, what: str) -> str:
    host = host_of(client)
    return (
        f"{host} answered, but {what}: is --host the Kubeflow Pipelines API and not a login "
        f"page in front of it? (e.g. http://localhost:8888 after `{PORT_FORWARD_HINT}`)"
    )


@contextlib.contextmanager
def reported_for(client: kfp.Client, action: str, namespace: str | None) -> Iterator[None]:
    host = host_of(client)
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
                        log.warning("%s", one_line(str(warning.message)))
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
        raise AmpbenchError(f"{action}: {one_line(str(error))}") from None
    except ValueError as error:  # kfp's own checks: duplicate names, a bad package
        raise AmpbenchError(f"{action} at {host}: {one_line(str(error))}") from None
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
        return f"cannot talk to {host} while {action}: {one_line(str(error.reason))}"
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
    text = one_line(str(text))
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
