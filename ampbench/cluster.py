"""What a pipeline step needs to know when Kubernetes runs it: that it does, and what the
cluster's ConfigMap (manifests/base/config.yaml) says beyond the endpoints."""

from __future__ import annotations

import os

from ampbench.errors import AmpbenchError
from ampbench.tracking import TRACKING_URI_ENV

# Set by Kubernetes in every pod; the KFP local runner and a user's shell have it unset.
POD_ENV = "KUBERNETES_SERVICE_HOST"
# From the ConfigMap: where training tasks checkpoint when a run names no checkpoint_dir.
CHECKPOINT_URI_ENV = "AMPBENCH_CHECKPOINT_URI"
CONFIG_MAP = "ampbench-config"
SECRET = "ampbench-s3"
# What the pods read from the ConfigMap (endpoints) and the Secret (keys) that manifests/
# creates, by name: the pipeline's tasks and the TrainJobs a train task creates alike.
CONFIG_MAP_KEYS = (
    TRACKING_URI_ENV,
    "AWS_ENDPOINT_URL",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REQUEST_CHECKSUM_CALCULATION",
    "AWS_RESPONSE_CHECKSUM_VALIDATION",
    CHECKPOINT_URI_ENV,
)
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# What a training pod (and each node of its TrainJob) asks for unless the run says otherwise.
GPU_RESOURCE = "nvidia.com/gpu"
TRAIN_CPU = "4"
TRAIN_MEMORY = "32Gi"
# NVIDIA's GPU operator taints GPU nodes so; training pods tolerate it.
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# Every training pod's memory-backed /dev/shm: NCCL and the CUDA caching allocator want a real
# one, which Kubernetes caps at 64 MiB without such a volume. (volume name, mount path)
SHM_VOLUME = ("dshm", "/dev/shm")


def in_pod() -> bool:
    return POD_ENV in os.environ


def check_tracking_server() -> None:
    """Inside a pod, refuse tracking without a tracking server: the default sqlite file would
    live and die with the pod, and the compare step, in another pod, would find no runs after
    all the GPU time was spent."""
    if not in_pod():
        return
    uri = os.environ.get(TRACKING_URI_ENV, "")
    if not uri.startswith(("http://", "https://", "databricks")):
        found = f"it is '{uri}'" if uri else "it is not set"
        raise AmpbenchError(
            f"tracking is on, but {TRACKING_URI_ENV} names no tracking server ({found}; the "
            f"ConfigMap '{CONFIG_MAP}' is missing or lacks it): runs would be lost with the pod. "
            "Deploy manifests/ or set the config_map parameter, or run with tracking=False"
        )


def default_checkpoint_dir() -> str:
    """Inside a pod, the ConfigMap's checkpoint location; elsewhere, none."""
    return os.environ.get(CHECKPOINT_URI_ENV, "") if in_pod() else ""
