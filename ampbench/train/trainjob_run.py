"""A TrainJob's life as a train task sees it: created (replacing an earlier attempt's), node 0's
log streamed into the task's, waited for until Complete or Failed, deleted; transient API
errors retried."""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ampbench.errors import AmpbenchError
from ampbench.logs import log
from ampbench.train.trainjob import API_VERSION, GROUP, NODE, PLURAL, TRAINER_VERSION, VERSION

# The JobSet labels that find node 0's pod.
NODE_0_SELECTOR = (
    "jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node,"
    "batch.kubernetes.io/job-completion-index=0"
)
POLL_S = 10.0
# Set on each TrainJob to the creating call's own random value: a TrainJob found under the
# name that carries it is that call's own (its first request went through, the reply was lost).
CREATION_MARK = "ampbench.io/creation"
DELETE_RETRY_S = 2.0
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _reason(error: Any) -> str:
    """The API server's own message from an ApiException."""
    try:
        return str(json.loads(error.body).get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(error, "reason", error))


def _condition(trainjob: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (trainjob.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


TRANSIENT_STATUSES = {429, 500, 502, 503, 504}
TRANSIENT_TRIES = 5


def _transient(error: BaseException) -> bool:
    """An API error worth another try: the server busy or restarting, the connection lost."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(error, ApiException):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, (HTTPError, ConnectionError, TimeoutError))


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


class TrainJobRun:
    """One TrainJob through the Kubernetes API: created, followed and deleted."""

    def __init__(
        self,
        api_client: Any,
        poll_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.poll_s = POLL_S if poll_s is None else poll_s
        self.sleep = sleep

    def create(self, body: dict[str, Any]) -> None:
        """Create the TrainJob. One found under its name is an earlier attempt's: replaced,
        once. One that carries this call's creation mark is this very TrainJob, made by a
        request whose reply was lost before it was sent again."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        mark = uuid.uuid4().hex
        metadata = {**body["metadata"]}
        metadata["annotations"] = {**metadata.get("annotations", {}), CREATION_MARK: mark}
        body = {**body, "metadata": metadata}
        what = f"TrainJob {name}: cannot be created"
        create = self.custom.create_namespaced_custom_object
        try:
            for replaced in (False, True):
                try:
                    self._retrying(what, create, GROUP, VERSION, namespace, PLURAL, body)
                    break
                except ApiException as error:
                    if error.status != 409:
                        raise
                    if self._creation_mark(namespace, name) == mark:
                        break
                    if replaced:
                        raise
                # The TrainJob of an earlier attempt of this task, killed before it could
                # delete it; the new one resumes from the run's checkpoints.
                log.warning("TrainJob %s exists (an earlier attempt): replacing it", name)
                self.delete(namespace, name)
                self._await_gone(namespace, name)
        except AmpbenchError:
            raise
        except Exception as error:  # sorted here: none is let through raw
            if isinstance(error, ApiException) and not _transient(error):
                raise self._refusal(body, error) from None
            # A request that went through before its reply was lost may have made the
            # TrainJob: deleted if so, or its nodes would hold GPUs until its deadline.
            with contextlib.suppress(AmpbenchError):
                if self._creation_mark(namespace, name) == mark:
                    self.delete(namespace, name)
            raise self._failure(what, error) from None
        log.info(
            "TrainJob %s/%s created (%s nodes)",
            namespace,
            name,
            body["spec"]["trainer"]["numNodes"],
        )

    def _read_if_there(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The TrainJob under this name, None where there is none; transient errors tried
        again, any other one line."""
        from kubernetes.client.exceptions import ApiException

        def read() -> dict[str, Any] | None:
            try:
                return self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name
                )
            except ApiException as error:
                if error.status == 404:
                    return None
                raise

        return self._call(f"TrainJob {name}: cannot be read", read)

    def _creation_mark(self, namespace: str, name: str) -> str | None:
        """The CREATION_MARK of the TrainJob under this name; None where it has none or is
        gone."""
        trainjob = self._read_if_there(namespace, name) or {}
        return ((trainjob.get("metadata") or {}).get("annotations") or {}).get(CREATION_MARK)

    @staticmethod
    def _refusal(body: dict[str, Any], error: Any) -> AmpbenchError:
        """The one line for an API error that creating the TrainJob ended with."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if error.status == 404:
            return AmpbenchError(
                f"num_nodes {body['spec']['trainer']['numNodes']}: this cluster has no "
                f"TrainJob API ({API_VERSION}); install Kubeflow Trainer {TRAINER_VERSION} "
                "or train on one node"
            )
        if error.status == 409:
            return AmpbenchError(
                f"TrainJob {name}: made again by someone else while the earlier attempt's was "
                f"replaced (is another attempt of this task running?): {_reason(error)}"
            )
        if error.status == 403:
            return AmpbenchError(
                f"TrainJob {name}: the pipeline's service account may not create TrainJobs "
                f"in namespace {namespace} (apply manifests/ for its Role): {_reason(error)}"
            )
        # The webhook refuses a TrainJob whose runtime does not exist, among others.
        return AmpbenchError(f"TrainJob {name}: refused: {_reason(error)}")

    @staticmethod
    def _failure(what: str, error: BaseException) -> AmpbenchError:
        if _transient(error):
            return AmpbenchError(f"{what}: failed {TRANSIENT_TRIES} times: {_reason(error)}")
        return AmpbenchError(f"{what}: {_reason(error)}")

    def _retrying(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        wait_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """fn(*args, **kwargs), tried again on transient errors (a busy or restarting API
        server must not end a training that runs fine), wait_s apart (default: poll_s); the
        last error is raised as it is."""
        import tenacity

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transient),
            stop=tenacity.stop_after_attempt(TRANSIENT_TRIES),
            wait=tenacity.wait_fixed(self.poll_s if wait_s is None else wait_s),
            sleep=self.sleep,
            before_sleep=lambda state: log.warning(
                "%s: %s; trying again",
                what,
                _reason(state.outcome.exception()),  # type: ignore[union-attr]  # set once tried
            ),
            reraise=True,
        )
        return retrying(fn, *args, **kwargs)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) through _retrying; any error it ends with is one line."""
        try:
            return self._retrying(what, fn, *args, **kwargs)
        except Exception as error:  # sorted here: none is let through raw
            raise self._failure(what, error) from None

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(
            f"TrainJob {name}: cannot be read",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
        )

    def node_0_pod(self, namespace: str, name: str) -> Any:
        pods = self._call(
            f"TrainJob {name}: its pods cannot be listed",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=NODE_0_SELECTOR.format(name=name),
        )
        return pods.items[0] if pods.items else None

    def stream_node_0_log(self, namespace: str, name: str, deadline: float) -> None:
        """Node 0's log, line by line, into this task's log, once its pod runs (or has run)."""
        while time.monotonic() < deadline:
            pod = self.node_0_pod(namespace, name)
            if pod is not None and pod.status.phase in ("Running", "Succeeded", "Failed"):
                try:
                    for line in self._log_lines(namespace, pod.metadata.name, deadline):
                        log.info("[%s node 0] %s", name, line)
                except Exception as error:  # the log is a courtesy, not the job
                    log.warning("node 0's log stopped (%s); waiting for the TrainJob", error)
                return
            if self._finished(self.get(namespace, name)):
                return  # it ended without a pod to read (refused, or never scheduled)
            self.sleep(self.poll_s)

    def _log_lines(self, namespace: str, pod: str, deadline: float) -> Iterator[str]:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod_log(
                pod,
                namespace,
                container=NODE,
                follow=True,
                _preload_content=False,
                # Never past the task's deadline, even if node 0 hangs.
                _request_timeout=max(1.0, deadline - time.monotonic()),
            )
        except ApiException as error:
            log.warning("node 0's log cannot be read: %s", _reason(error))
            return
        pending = b""
        for chunk in response.stream():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            yield from (line.decode("utf-8", "replace") for line in lines)
        if pending:
            yield pending.decode("utf-8", "replace")

    @staticmethod
    def _finished(trainjob: dict[str, Any]) -> bool:
        return any(_condition(trainjob, kind) for kind in ("Complete", "Failed"))

    def wait(self, namespace: str, name: str, deadline: float) -> None:
        """Until the TrainJob is Complete; a Failed one, or the deadline, is one line."""
        while True:
            trainjob = self.get(namespace, name)
            if _condition(trainjob, "Complete"):
                log.info("TrainJob %s: Complete", name)
                return
            failed = _condition(trainjob, "Failed")
            if failed is not None:
                why = [failed.get("reason") or "no reason", failed.get("message")]
                raise AmpbenchError(f"TrainJob {name}: Failed ({': '.join(filter(None, why))})")
            if time.monotonic() >= deadline:
                raise AmpbenchError(f"TrainJob {name}: not finished within the task's time")
            self.sleep(self.poll_s)

    def _await_gone(self, namespace: str, name: str) -> None:
        for _ in range(60):
            if self._read_if_there(namespace, name) is None:
                return
            self.sleep(min(self.poll_s, 5.0))
        raise AmpbenchError(f"TrainJob {name}: an earlier attempt's TrainJob does not go away")

    def delete(self, namespace: str, name: str) -> None:
        """Delete the TrainJob (transient errors tried again, soon enough to end within a
        pod's 30 s of grace after SIGTERM); a failure is a warning: this runs on the way out,
        and activeDeadlineSeconds ends a TrainJob left behind."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._retrying(
                f"TrainJob {name}: cannot be deleted",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                wait_s=min(self.poll_s, DELETE_RETRY_S),
            )
        except Exception as error:  # sorted here: none is let through raw
            if isinstance(error, ApiException) and error.status == 404:
                return  # gone already (a retried request whose first reply was lost)
            log.warning("TrainJob %s: not deleted: %s", name, _reason(error))

    def run(self, body: dict[str, Any], timeout_s: float) -> None:
        """Create, stream node 0's log, wait for the end; the TrainJob is deleted whatever
        happens (its pods hold GPUs)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        deadline = time.monotonic() + timeout_s
        self.create(body)
        # Kubernetes stops a task's pod with SIGTERM (a stopped run, a timeout, a drained
        # node): made an exception here, so that the TrainJob is deleted on the way out.
        previous = signal.signal(signal.SIGTERM, _terminated)
        try:
            self.stream_node_0_log(namespace, name, deadline)
            self.wait(namespace, name, deadline)
        finally:
            self.delete(namespace, name)
            signal.signal(signal.SIGTERM, previous)


def in_cluster_client() -> tuple[Any, str]:
    """An API client from the pod's service account, and the pod's namespace."""
    from pathlib import Path

    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException as error:
        raise AmpbenchError(
            f"num_nodes above 1: a TrainJob is made from inside a Kubernetes pod ({error})"
        ) from None
    return client.ApiClient(), Path(SERVICE_ACCOUNT_NAMESPACE).read_text(encoding="utf-8").strip()
