"""Submit a run of the pipeline to Kubeflow Pipelines and follow it, or upload the pipeline.

`submit_run` creates a run from a compiled pipeline (in a KFP experiment) and can wait for it to
finish; `upload_pipeline` stores the pipeline, or a new version of it, on the server. The
client comes from `ampbench.pipelines.client.make_client`.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kfp
from kfp.client.client import KF_PIPELINES_DEFAULT_EXPERIMENT_NAME

from ampbench import __version__
from ampbench.errors import AmpbenchError, one_line
from ampbench.logs import log
from ampbench.pipelines.client import host_of, not_the_api, reported_for, ui_url

DEFAULT_KFP_EXPERIMENT = "ampbench"
DEFAULT_POLL_INTERVAL_S = 5.0
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELED")


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


# -- submitting ---------------------------------------------------------------------------------
def timestamp() -> str:
    """When a run or a pipeline version was made, in the names ampbench gives them."""
    return f"{datetime.datetime.now():%Y-%m-%d %H-%M-%S}"


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

    experiment: None takes $KF_PIPELINES_DEFAULT_EXPERIMENT_NAME, else DEFAULT_KFP_EXPERIMENT.
    Waiting ends in SUCCEEDED, or raises AmpbenchError for any other end state or `timeout`.
    """
    experiment = experiment or os.environ.get(KF_PIPELINES_DEFAULT_EXPERIMENT_NAME)
    multi_user = getattr(client, "ampbench_multi_user", False)
    # kfp takes the namespace from its context file or the pod's own, when it finds one.
    if multi_user and not namespace and not client.get_user_namespace():
        raise AmpbenchError(
            f"{host_of(client)} is a multi-user Kubeflow: pass --namespace with the profile "
            "namespace to run in"
        )
    with reported_for(client, "submitting the run", namespace):
        result = client.create_run_from_pipeline_package(
            str(pipeline_file),
            arguments=arguments,
            run_name=run_name,
            experiment_name=experiment or DEFAULT_KFP_EXPERIMENT,
            namespace=namespace,
        )
    if not result.run_id:
        raise AmpbenchError(not_the_api(client, "the new run has no id"))
    run = RunInfo(
        run_id=result.run_id,
        run_name=result.run_info.display_name or run_name or result.run_id,
        experiment_id=result.run_info.experiment_id,
        url=ui_url(client, f"runs/details/{result.run_id}"),
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
        with reported_for(client, f"polling run {run.run_id}", None):
            info = client.get_run(run.run_id)
        if info.run_id != run.run_id:  # no run at all: polling it again would never end
            raise AmpbenchError(not_the_api(client, f"its answer for run {run.run_id} is no run"))
        state = str(info.state or "RUNTIME_STATE_UNSPECIFIED")
        if state != seen:
            log.info("run %s: %s", run.run_id, state)
            seen = state
        if state == "SUCCEEDED":
            return RunInfo(run.run_id, run.run_name, run.experiment_id, run.url, state)
        if state in TERMINAL_STATES:
            reason = one_line(getattr(info.error, "message", None) or "")
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
    with reported_for(client, f"looking up pipeline '{name}'", namespace):
        pipeline_id = _pipeline_id(client, name, namespace)
    if pipeline_id is None:
        if version:
            log.info("'%s' is a new pipeline: its first version takes its name", name)
        with reported_for(client, f"uploading pipeline '{name}'", namespace):
            pipeline = client.upload_pipeline(
                str(pipeline_file),
                pipeline_name=name,
                description=description,
                namespace=namespace,
            )
        if not pipeline.pipeline_id:
            raise AmpbenchError(not_the_api(client, "the new pipeline has no id"))
        url = ui_url(client, f"pipelines/details/{pipeline.pipeline_id}")
        return UploadInfo(pipeline.pipeline_id, name, None, None, url)
    version = version or f"{name} {__version__} {timestamp()}"
    with reported_for(client, f"uploading version '{version}' of '{name}'", namespace):
        uploaded = client.upload_pipeline_version(
            str(pipeline_file),
            pipeline_version_name=version,
            pipeline_id=pipeline_id,
            description=description,
        )
    if not uploaded.pipeline_version_id:
        raise AmpbenchError(not_the_api(client, "the new pipeline version has no id"))
    url = ui_url(client, f"pipelines/details/{pipeline_id}/version/{uploaded.pipeline_version_id}")
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
            f"{len(found)} pipelines are named '{name}' at {host_of(client)} ({ids}): pass a "
            "--name that no other pipeline has, or delete all but one of them"
        )
    return found[0].pipeline_id
