"""The DAG: prepare -> train, for each run of the experiment matrix (arm x seed) -> compare.

By default the matrix is the published pair, fp32 and amp, one seed (ampbench/matrix.py).

The pipeline is built by a function so that the component image, the schedule and the task
timeout are chosen when it is compiled (`ampbench compile --image ...`), not when this module
is imported. Everything a cluster administrator tunes per run (GPU kind and count, node
selector, CPU and memory, the Secret and ConfigMap the pods read) is a pipeline parameter.
"""

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl.base_component import BaseComponent
from kfp.dsl.graph_component import GraphComponent
from kfp.dsl.pipeline_channel import PipelineParameterChannel

from ampbench import DEFAULT_IMAGE, PIPELINE_NAME
from ampbench.cluster import CONFIG_MAP, CONFIG_MAP_KEYS, SECRET, SECRET_KEYS
from ampbench.components.compare.component import compare
from ampbench.components.prepare.component import prepare
from ampbench.components.train.component import train
from ampbench.matrix import DEFAULT_RUNS
from ampbench.tracking import DEFAULT_EXPERIMENT
from ampbench.train import BASELINE_PRECISION, DEFAULT_DATA
from ampbench.train.config import TrainConfig
from ampbench.train.trainjob import DEFAULT_RUNTIME, DEFAULT_TIMEOUT_S

SCHEDULES = ("parallel", "sequential")
TRAIN_RETRIES = 2


class PipelineOutputs(NamedTuple):
    """The compare step's outputs, by the names the compare component gives them."""

    comparison: dsl.Artifact
    report: dsl.Markdown
    report_html: dsl.HTML
    plots: dsl.Artifact


def with_image(component: BaseComponent, image: str) -> BaseComponent:
    """The same lightweight component, built on another image."""
    return dsl.component(component.python_func, base_image=image, install_kfp_package=False)


def use_cluster_settings(
    task: dsl.PipelineTask, config_map: PipelineParameterChannel, secret: PipelineParameterChannel
) -> None:
    """Endpoints from the ConfigMap, S3 keys from the Secret (both optional: a local runner or a
    cluster with other means of configuration has neither)."""
    kubernetes.use_config_map_as_env(
        task, config_map, {key: key for key in CONFIG_MAP_KEYS}, optional=True
    )
    kubernetes.use_secret_as_env(task, secret, {key: key for key in SECRET_KEYS}, optional=True)


def build_pipeline(
    image: str = DEFAULT_IMAGE,
    schedule: str = "parallel",
    train_timeout_s: int = DEFAULT_TIMEOUT_S,
) -> GraphComponent:
    """The ampbench pipeline, its components on `image`.

    schedule: "parallel" trains all runs of the matrix at once (one GPU node each);
    "sequential" trains them one after another, for arms measured on one GPU (the same kind
    of node), and for the local runner, where arms running at once would share the same CPU
    cores and timings.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
    prepare_op = with_image(prepare, image)
    train_op = with_image(train, image)
    compare_op = with_image(compare, image)
    sequential = schedule == "sequential"

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Automatic mixed precision against FP32: speed, memory and accuracy.",
    )
    def ampbench_pipeline(
        data: str = DEFAULT_DATA,
        subset: int = TrainConfig.subset,
        epochs: int = TrainConfig.epochs,
        lr: float = TrainConfig.lr,
        # The experiment matrix: [{"model", "batch_size", "precision", "seed"}, ...], one
        # training task each (`ampbench submit --models --batch-sizes --precisions --seeds`
        # makes it); every (model, batch size) group needs a baseline_precision run.
        runs: list = DEFAULT_RUNS,
        baseline_precision: str = BASELINE_PRECISION,
        image_size: int = TrainConfig.image_size,
        target_accuracy: float = TrainConfig.target_accuracy,
        allow_emulated: bool = TrainConfig.allow_emulated,
        cuda_graphs: bool = TrainConfig.cuda_graphs,
        allow_mismatch: bool = False,
        experiment: str = DEFAULT_EXPERIMENT,
        tracking: bool = True,
        registered_model_name: str = "",
        max_accuracy_drop: float = -1.0,
        checkpoint_dir: str = "",
        checkpoint_every: int = 200,
        gpu_resource: str = "nvidia.com/gpu",
        # GPUs per training task (more than 1: torchrun, one process per GPU) and nodes per
        # training task (more than 1: a Kubeflow Trainer TrainJob of trainer_runtime, each
        # node gpu_count GPUs; needs checkpoint_dir, or the ConfigMap's, on S3).
        gpu_count: int = 1,
        num_nodes: int = 1,
        # With several processes: the precision DDP all-reduces gradients in (fp32, bf16, fp16).
        grad_comm: str = TrainConfig.grad_comm,
        trainer_runtime: str = DEFAULT_RUNTIME,
        gpu_node_selector: dict = {},  # noqa: B006 - e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        train_cpu: str = "4",
        train_memory: str = "32Gi",
        prepare_cpu: str = "2",
        prepare_memory: str = "8Gi",
        config_map: str = CONFIG_MAP,
        s3_secret: str = SECRET,
    ) -> PipelineOutputs:
        # The prepare step also checks the training settings against the data: a user's
        # mistake fails there, once, not in the training tasks (retried on any failure).
        # It checks the tracking configuration too, first: so it must run each time, not be
        # answered from KFP's cache.
        prepared = prepare_op(
            data=data,
            subset=subset,
            runs=runs,
            baseline_precision=baseline_precision,
            train_image_size=image_size,
            epochs=epochs,
            lr=lr,
            gpu_count=gpu_count,
            num_nodes=num_nodes,
            grad_comm=grad_comm,
            tracking=tracking,
        ).set_display_name("prepare")
        prepared.set_caching_options(False)
        prepared.set_cpu_request(prepare_cpu).set_cpu_limit(prepare_cpu)
        prepared.set_memory_request(prepare_memory).set_memory_limit(prepare_memory)
        use_cluster_settings(prepared, config_map, s3_secret)
        with dsl.ParallelFor(runs, parallelism=1 if sequential else 0) as run:
            task = train_op(
                dataset=prepared.outputs["dataset"],
                precision=run.precision,
                epochs=epochs,
                batch_size=run.batch_size,
                lr=lr,
                seed=run.seed,
                model_name=run.model,
                image_size=image_size,
                target_accuracy=target_accuracy,
                allow_emulated=allow_emulated,
                cuda_graphs=cuda_graphs,
                grad_comm=grad_comm,
                experiment=experiment,
                pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                tracking=tracking,
                registered_model_name=registered_model_name,
                checkpoint_dir=checkpoint_dir,
                checkpoint_every=checkpoint_every,
                # Passed as inputs as well: kfp 2.17 threads a pipeline parameter into a
                # ParallelFor only when a task there takes it as an input, and the
                # resource placeholders below would otherwise not resolve.
                requested_gpu_type=gpu_resource,
                requested_gpu_count=gpu_count,
                requested_cpu=train_cpu,
                requested_memory=train_memory,
                num_nodes=num_nodes,
                trainer_runtime=trainer_runtime,
                trainjob_image=image,
                timeout_s=train_timeout_s,
                node_selector=gpu_node_selector,
                config_map=config_map,
                s3_secret=s3_secret,
            )
            task.set_display_name("train")
            task.set_accelerator_type(gpu_resource).set_accelerator_limit(gpu_count)
            task.set_cpu_request(train_cpu).set_cpu_limit(train_cpu)
            task.set_memory_request(train_memory).set_memory_limit(train_memory)
            # Timings are the point of these tasks: never answer them from a cache.
            task.set_caching_options(False)
            # A preempted GPU node costs one checkpoint interval: the retried task resumes
            # from the newest checkpoint under checkpoint_dir (same run id, arm and seed).
            task.set_retry(TRAIN_RETRIES, backoff_duration="30s", backoff_factor=2.0)
            kubernetes.set_timeout(task, train_timeout_s)
            kubernetes.add_node_selector_json(task, gpu_node_selector)
            kubernetes.add_toleration(
                task, key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"
            )
            # DataLoader-free, but NCCL and the CUDA caching allocator still want a real
            # /dev/shm, which Kubernetes caps at 64 MiB unless a memory volume is mounted.
            kubernetes.empty_dir_mount(task, "dshm", "/dev/shm", medium="Memory")
            use_cluster_settings(task, config_map, s3_secret)
        compared = compare_op(
            results=dsl.Collected(task.outputs["results"]),
            baseline_precision=baseline_precision,
            experiment=experiment,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            tracking=tracking,
            max_accuracy_drop=max_accuracy_drop,
            allow_mismatch=allow_mismatch,
        ).set_display_name("compare")
        compared.set_caching_options(False)
        use_cluster_settings(compared, config_map, s3_secret)
        return PipelineOutputs(*(compared.outputs[name] for name in PipelineOutputs._fields))

    return ampbench_pipeline
