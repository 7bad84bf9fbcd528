"""The DAG: prepare -> train(baseline) || train(amp), for each seed -> compare.

The pipeline is built by a function so that the component image and the schedule are chosen
when it is compiled (`ampbench compile --image ...`), not when this module is imported.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl.base_component import BaseComponent
from kfp.dsl.graph_component import GraphComponent

from ampbench import DEFAULT_IMAGE
from ampbench.components.compare.component import compare
from ampbench.components.prepare.component import prepare
from ampbench.components.train.component import train

PIPELINE_NAME = "ampbench"
SCHEDULES = ("parallel", "sequential")


class PipelineOutputs(NamedTuple):
    comparison: dsl.Artifact
    report: dsl.Markdown


def with_image(component: BaseComponent, image: str) -> BaseComponent:
    """The same lightweight component, built on another image."""
    return dsl.component(component.python_func, base_image=image, install_kfp_package=False)


def build_pipeline(image: str = DEFAULT_IMAGE, schedule: str = "parallel") -> GraphComponent:
    """The ampbench pipeline, its components on `image`.

    schedule: "parallel" trains all arms and seeds at once (one GPU node each);
    "sequential" trains them one after another, for arms measured on one GPU, and for the
    local runner, where arms running at once would share the same CPU cores and timings.
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
        data: str = "cifar10",
        subset: int = 0,
        epochs: int = 2,
        batch_size: int = 128,
        lr: float = 0.1,
        seeds: list = [0],  # noqa: B006 - KFP pipeline parameters take their defaults this way
        model_name: str = "resnet18",
        baseline_precision: str = "fp32",
        amp_precision: str = "amp",
        experiment: str = "ampbench",
        tracking: bool = True,
        max_accuracy_drop: float = -1.0,
        gpu_resource: str = "nvidia.com/gpu",
        gpu_count: int = 1,
    ) -> PipelineOutputs:
        prepared = prepare_op(data=data, subset=subset).set_display_name("prepare")
        with dsl.ParallelFor(seeds, parallelism=1 if sequential else 0) as seed:
            arms = {}
            for arm, precision in (("fp32", baseline_precision), ("amp", amp_precision)):
                task = train_op(
                    dataset=prepared.outputs["dataset"],
                    precision=precision,
                    epochs=epochs,
                    batch_size=batch_size,
                    lr=lr,
                    seed=seed,
                    model_name=model_name,
                    experiment=experiment,
                    pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    tracking=tracking,
                    # Passed as inputs as well: kfp 2.17 threads a pipeline parameter into a
                    # ParallelFor only when a task there takes it as an input, and the
                    # accelerator placeholders below would otherwise not resolve.
                    requested_gpu_type=gpu_resource,
                    requested_gpu_count=gpu_count,
                )
                task.set_display_name(f"train-{arm}")
                task.set_accelerator_type(gpu_resource).set_accelerator_limit(gpu_count)
                # Timings are the point of these tasks: never answer them from a cache.
                task.set_caching_options(False)
                arms[arm] = task
            if sequential:
                arms["amp"].after(arms["fp32"])
        compared = compare_op(
            baseline_results=dsl.Collected(arms["fp32"].outputs["results"]),
            amp_results=dsl.Collected(arms["amp"].outputs["results"]),
            baseline_precision=baseline_precision,
            amp_precision=amp_precision,
            experiment=experiment,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            tracking=tracking,
            max_accuracy_drop=max_accuracy_drop,
        ).set_display_name("compare")
        compared.set_caching_options(False)
        return PipelineOutputs(compared.outputs["comparison"], compared.outputs["report"])

    return ampbench_pipeline
