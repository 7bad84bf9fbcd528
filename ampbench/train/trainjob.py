"""Training across nodes through Kubeflow Trainer v2: the TrainJob a train task creates, which
runs the worker (worker.py) under torchrun on every node (trainjob_run.py creates it, waits for it
and streams node 0's log).

Built with the `kubernetes` client (a dependency of kfp-kubernetes already), not the Kubeflow
SDK, whose TrainerClient cannot run ampbench's own image and command with its tasks' settings.
Pinned to TrainJob trainer.kubeflow.org/v1alpha1 of Kubeflow Trainer v2.3.0 (spec.runtimePatches:
a v2.1 cluster refuses it). The torch runtime sets torchrun's PET_* variables on each node;
processes per node are stated (numProcPerNode), not inferred from the GPU limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampbench.cluster import GPU_RESOURCE, GPU_TOLERATION, SHM_VOLUME, TRAIN_CPU, TRAIN_MEMORY
from ampbench.train import worker

TRAINER_VERSION = "v2.3.0"
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_RUNTIME = "torch-distributed"
# How long a train task, and a TrainJob it creates, may run (the pipeline's train_timeout_s).
DEFAULT_TIMEOUT_S = 6 * 3600
# The runtime's trainer job and container (Trainer's constants.Node).
NODE = "node"
PATCH_MANAGER = "ampbench"
PART_OF = {"app.kubernetes.io/part-of": "ampbench"}
NODE_POD_LABELS = {**PART_OF, "app.kubernetes.io/component": "trainjob-node"}


@dataclass(frozen=True)
class TrainJobSpec:
    """What the TrainJob runs and on what: the same settings as the pipeline's other tasks."""

    name: str
    namespace: str
    image: str
    arguments: list[str]  # the worker's
    num_nodes: int
    gpus_per_node: int
    gpu_resource: str = GPU_RESOURCE
    cpu: str = TRAIN_CPU
    memory: str = TRAIN_MEMORY
    runtime: str = DEFAULT_RUNTIME
    config_map: str = ""
    config_map_keys: tuple[str, ...] = ()
    secret: str = ""
    secret_keys: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    # Trainer ends the TrainJob after this long, whatever became of the task that made it.
    active_deadline_s: int = DEFAULT_TIMEOUT_S


def _env(spec: TrainJobSpec) -> list[dict[str, Any]]:
    """The ConfigMap's and the Secret's keys, each optional, as the pipeline's pods read them."""

    def ref(kind: str, name: str, key: str) -> dict[str, Any]:
        return {"name": key, "valueFrom": {kind: {"name": name, "key": key, "optional": True}}}

    config = [ref("configMapKeyRef", spec.config_map, key) for key in spec.config_map_keys]
    secret = [ref("secretKeyRef", spec.secret, key) for key in spec.secret_keys]
    return (config if spec.config_map else []) + (secret if spec.secret else [])


def _node_pod(spec: TrainJobSpec) -> dict[str, Any]:
    """What each node's pod adds to the runtime's template."""
    shm, shm_path = SHM_VOLUME
    pod_patch: dict[str, Any] = {
        "volumes": [{"name": shm, "emptyDir": {"medium": "Memory"}}],
        "containers": [{"name": NODE, "volumeMounts": [{"name": shm, "mountPath": shm_path}]}],
        "tolerations": [dict(GPU_TOLERATION)],
    }
    if spec.node_selector:
        pod_patch["nodeSelector"] = dict(spec.node_selector)
    # Labelled for manifests/' NetworkPolicy that lets the nodes reach each other.
    return {"metadata": {"labels": dict(NODE_POD_LABELS)}, "spec": pod_patch}


def manifest(spec: TrainJobSpec) -> dict[str, Any]:
    """The TrainJob object (trainer.kubeflow.org/v1alpha1, Trainer v2.3)."""
    resources = {"cpu": spec.cpu, "memory": spec.memory}
    if spec.gpus_per_node:
        resources[spec.gpu_resource] = str(spec.gpus_per_node)
    node_pod = _node_pod(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": dict(PART_OF),
        },
        "spec": {
            "runtimeRef": {
                "name": spec.runtime,
                "apiGroup": GROUP,
                "kind": "ClusterTrainingRuntime",
            },
            "activeDeadlineSeconds": spec.active_deadline_s,
            "trainer": {
                "image": spec.image,
                # torchrun reads the nodes, node rank and master from the runtime's PET_* env.
                "command": ["python", "-m", "torch.distributed.run", "--module", worker.__name__],
                "args": list(spec.arguments),
                "env": _env(spec),
                "numNodes": spec.num_nodes,
                "numProcPerNode": max(1, spec.gpus_per_node),
                "resourcesPerNode": {"requests": dict(resources), "limits": dict(resources)},
            },
            "runtimePatches": [
                {
                    "manager": PATCH_MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": NODE,
                                        "template": {"spec": {"template": node_pod}},
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }
