"""The DAG: prepare -> train, for each run of the experiment matrix (arm x seed) -> compare.

By default the matrix is the published pair, fp32 and amp, one seed (ampbench/matrix.py).

The pipeline is built by a function so that the component image and the schedule are chosen
when it is compiled (`ampbench compile --image ... --schedule ...`), not when this module is
imported. Everything a cluster administrator tunes per run (GPU kind and count, node
selector, CPU and memory, the Secret and ConfigMap the pods read) is a pipeline parameter.
"""

import inspect
from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl.base_component import BaseComponent
from kfp.dsl.graph_component import GraphComponent
from kfp.dsl.pipeline_channel import PipelineParameterChannel

from ampbench import DEFAULT_IMAGE, PIPELINE_NAME
from ampbench.cluster import CONFIG_MAP_KEYS, GPU_TOLERATION, SECRET_KEYS, SHM_VOLUME
from ampbench.components.compare.component import compare
from ampbench.components.prepare.component import prepare
from ampbench.components.train.component import train
from ampbench.experiment import Experiment, Resources, parameters, section_values
from ampbench.train.trainjob import DEFAULT_TIMEOUT_S

SCHEDULES = ("parallel", "sequential")  # the first: the default
TRAIN_RETRIES = 2


class PipelineOutputs(NamedTuple):
    """The compare step's outputs, by the names the compare component gives them, and every
    training task's model (each named by its metadata's "run", matrix.run_name)."""

    comparison: dsl.Artifact
    report: dsl.Markdown
    report_html: dsl.HTML
    plots: dsl.Artifact
    models: list[dsl.Model]  # last: the fields before it are the compare step's


# The pipeline's parameters are the experiment's leaves (ampbench/experiment.py): KFP reads
# them, their types, defaults and descriptions from the signature and the docstring.
PARAMETERS = parameters()
PARAMETER_NAMES = [parameter.name for parameter in PARAMETERS]
SIGNATURE = inspect.Signature(
    [
        inspect.Parameter(
            parameter.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=parameter.default,
            annotation=parameter.type,
        )
        for parameter in PARAMETERS
    ],
    return_annotation=PipelineOutputs,
)
DESCRIPTION = "Automatic mixed precision against FP32: speed, memory and accuracy."
DOCSTRING = f"{DESCRIPTION}\n\nArgs:\n" + "".join(
    f"    {parameter.name}: {parameter.description}\n" for parameter in PARAMETERS
)


def with_image(component: BaseComponent, image: str) -> BaseComponent:
    """The same lightweight component, built on another image."""
    return dsl.component(component.python_func, base_image=image, install_kfp_package=False)


def set_resources(task: dsl.PipelineTask, cpu: str, memory: str) -> None:
    """Requests equal to limits, so a task gets what it asked for."""
    task.set_cpu_request(cpu).set_cpu_limit(cpu)
    task.set_memory_request(memory).set_memory_limit(memory)


def use_cluster_settings(task: dsl.PipelineTask, resources: Resources) -> None:
    """Endpoints from the ConfigMap, S3 keys from the Secret (both optional: a local runner or a
    cluster with other means of configuration has neither)."""
    config_map, secret = resources.config_map, resources.s3_secret
    kubernetes.use_config_map_as_env(
        task, config_map, {key: key for key in CONFIG_MAP_KEYS}, optional=True
    )
    kubernetes.use_secret_as_env(task, secret, {key: key for key in SECRET_KEYS}, optional=True)


def build_pipeline(
    image: str = DEFAULT_IMAGE,
    schedule: str = SCHEDULES[0],
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

    def ampbench_pipeline(*values: PipelineParameterChannel) -> PipelineOutputs:
        # KFP calls it with a placeholder per parameter, in the signature's order.
        e = Experiment.from_parameters(dict(zip(PARAMETER_NAMES, values, strict=True)))
        # Prepare checks the settings and the tracking configuration once, before the retried
        # training tasks, so it must run each time, not be answered from KFP's cache.
        prepared = prepare_op(
            **section_values(e.training),
            data=e.dataset.data,
            subset=e.dataset.subset,
            runs=e.arms.runs,
            baseline_precision=e.arms.baseline_precision,
            train_image_size=e.dataset.image_size,
            gpu_count=e.resources.gpu_count,
            num_nodes=e.resources.num_nodes,
            tracking=e.tracking.tracking,
        ).set_display_name("prepare")
        prepared.set_caching_options(False)
        set_resources(prepared, e.resources.prepare_cpu, e.resources.prepare_memory)
        use_cluster_settings(prepared, e.resources)
        with dsl.ParallelFor(e.arms.runs, parallelism=1 if sequential else 0) as run:
            # The train step takes every training and tracking setting by its name.
            task = train_op(
                **section_values(e.training),
                **section_values(e.tracking),
                dataset=prepared.outputs["dataset"],
                precision=run.precision,
                batch_size=run.batch_size,
                seed=run.seed,
                model_name=run.model,
                image_size=e.dataset.image_size,
                pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                # Inputs too: kfp 2.17 threads a pipeline parameter into a ParallelFor only
                # when a task there takes it, and the resource placeholders need them.
                requested_gpu_type=e.resources.gpu_resource,
                requested_gpu_count=e.resources.gpu_count,
                requested_cpu=e.resources.train_cpu,
                requested_memory=e.resources.train_memory,
                num_nodes=e.resources.num_nodes,
                trainer_runtime=e.resources.trainer_runtime,
                trainjob_image=image,
                timeout_s=train_timeout_s,
                node_selector=e.resources.gpu_node_selector,
                config_map=e.resources.config_map,
                s3_secret=e.resources.s3_secret,
            )
            task.set_display_name("train")
            task.set_accelerator_type(e.resources.gpu_resource)
            task.set_accelerator_limit(e.resources.gpu_count)
            set_resources(task, e.resources.train_cpu, e.resources.train_memory)
            # Timings are the point of these tasks: never answer them from a cache.
            task.set_caching_options(False)
            # A preempted GPU node costs one checkpoint interval: the retried task resumes
            # from the newest checkpoint under checkpoint_dir (same run id, arm and seed).
            task.set_retry(TRAIN_RETRIES, backoff_duration="30s", backoff_factor=2.0)
            kubernetes.set_timeout(task, train_timeout_s)
            kubernetes.add_node_selector_json(task, e.resources.gpu_node_selector)
            kubernetes.add_toleration(task, **GPU_TOLERATION)
            kubernetes.empty_dir_mount(task, *SHM_VOLUME, medium="Memory")
            use_cluster_settings(task, e.resources)
        compared = compare_op(
            **section_values(e.comparison),
            results=dsl.Collected(task.outputs["results"]),
            baseline_precision=e.arms.baseline_precision,
            experiment=e.tracking.experiment,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            tracking=e.tracking.tracking,
        ).set_display_name("compare")
        compared.set_caching_options(False)
        use_cluster_settings(compared, e.resources)
        compare_outputs = (compared.outputs[name] for name in PipelineOutputs._fields[:-1])
        return PipelineOutputs._make([*compare_outputs, dsl.Collected(task.outputs["model"])])

    ampbench_pipeline.__signature__ = SIGNATURE  # type: ignore[attr-defined]
    ampbench_pipeline.__doc__ = DOCSTRING
    return dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)(ampbench_pipeline)
