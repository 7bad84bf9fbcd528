"""run_train_task: where a pipeline's train task trains its arm, with what checkpoints and
deadline. The three ways of training are tested for themselves (test_train_engine.py,
test_distributed.py); here they are stood in for, to see which one a task chooses and with what."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ampbench.cluster import CHECKPOINT_URI_ENV, POD_ENV
from ampbench.errors import AmpbenchError
from ampbench.train import task
from ampbench.train.config import TrainConfig
from ampbench.train.launch import trainjob_name
from ampbench.train.task import Placement, run_train_task


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Each way of training, recording its arguments instead of training."""
    seen: dict[str, Any] = {}
    for name in ("run_training", "train_in_processes", "train_on_nodes"):

        def record(*args: Any, _name: str = name, **kwargs: Any) -> str:
            seen[_name] = (args, kwargs)
            return _name

        monkeypatch.setattr(task, name, record)
    monkeypatch.delenv(POD_ENV, raising=False)
    return seen


def config() -> TrainConfig:
    return TrainConfig(
        dataset_dir=Path("data"), precision="bf16", model="small-cnn", batch_size=32, seed=3
    )


def test_one_gpu_or_none_trains_here_without_checkpoints_unless_asked(calls: dict) -> None:
    outcome = run_train_task(config(), Path("r"), Path("m"), None, Placement(gpu_count=1))
    assert outcome == "run_training" and set(calls) == {"run_training"}
    (trained, *_), _ = calls["run_training"]
    assert trained.checkpoint_dir is None and trained.checkpoint_every == 0
    assert not trained.resume


def test_a_checkpoint_dir_gives_each_run_of_each_pipeline_run_its_own_folder_to_resume_from(
    calls: dict,
) -> None:
    run_train_task(config(), Path("r"), Path("m"), None, Placement(), "s3://b/ckpt/", 25, "run-7")
    (trained, *_), _ = calls["run_training"]
    assert trained.checkpoint_dir == "s3://b/ckpt/run-7/small-cnn-b32-bf16-seed3"
    assert trained.checkpoint_every == 25 and trained.resume


def test_a_compiled_arm_shares_its_compiled_step_beside_the_checkpoints(calls: dict) -> None:
    """Across arms, seeds and pipeline runs: the checkpoint location's compile-cache folder,
    unless the task was given one; an arm that does not compile gets none."""
    compiled = dataclasses.replace(config(), compile=True)
    run_train_task(compiled, Path("r"), Path("m"), None, Placement(), "s3://b/ckpt/", 0, "run-7")
    (trained, *_), _ = calls["run_training"]
    assert trained.compile_cache == "s3://b/ckpt/compile-cache"
    given = dataclasses.replace(compiled, compile_cache="/shared/cc")
    run_train_task(given, Path("r"), Path("m"), None, Placement(), "s3://b/ckpt/", 0, "run-7")
    (trained, *_), _ = calls["run_training"]
    assert trained.compile_cache == "/shared/cc"
    off = dataclasses.replace(compiled, compile_cache="off")
    run_train_task(off, Path("r"), Path("m"), None, Placement(), "s3://b/ckpt/", 0, "run-7")
    (trained, *_), _ = calls["run_training"]
    assert trained.compile_cache == "off"  # the engine reads it as none
    eager = dataclasses.replace(config(), compile_cache="/shared/cc")
    run_train_task(eager, Path("r"), Path("m"), None, Placement(), "s3://b/ckpt/", 0, "run-7")
    (trained, *_), _ = calls["run_training"]
    assert trained.compile_cache is None


def test_in_a_pod_the_config_maps_checkpoint_location_is_the_default(
    calls: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POD_ENV, "pod-1")
    monkeypatch.setenv(CHECKPOINT_URI_ENV, "s3://cm/ckpt")
    run_train_task(config(), Path("r"), Path("m"), None, Placement(), "", 0, "run-7")
    (trained, *_), _ = calls["run_training"]
    assert trained.checkpoint_dir == "s3://cm/ckpt/run-7/small-cnn-b32-bf16-seed3"


def test_several_gpus_train_in_one_process_each(calls: dict) -> None:
    run_train_task(config(), Path("r"), Path("m"), None, Placement(gpu_count=4))
    (_, processes, *_), _ = calls["train_in_processes"]
    assert set(calls) == {"train_in_processes"} and processes == 4


def test_several_nodes_train_in_a_trainjob_whose_deadline_is_the_tasks_timeout(
    calls: dict,
) -> None:
    placement = Placement(
        gpu_type="nvidia.com/gpu", gpu_count=8, cpu="16", memory="64Gi", num_nodes=2,
        trainer_runtime="torch-custom", trainjob_image="registry.example/ampbench:2",
        node_selector={"gpu": "h200"}, config_map="cm", s3_secret="keys", timeout_s=1234,
    )  # fmt: skip
    run_train_task(config(), Path("r"), Path("m"), None, placement, "s3://b/ck", 0, "run-7")
    (_, job, shared, *_), _ = calls["train_on_nodes"]
    assert set(calls) == {"train_on_nodes"}
    assert job.active_deadline_s == 1234  # the TrainJob's, and how long the task waits for it
    assert job.name == trainjob_name("run-7", "small-cnn-b32-bf16-seed3")
    assert shared == "s3://b/ck/run-7/small-cnn-b32-bf16-seed3"
    assert (job.num_nodes, job.gpus_per_node, job.gpu_resource) == (2, 8, "nvidia.com/gpu")
    assert (job.cpu, job.memory, job.runtime) == ("16", "64Gi", "torch-custom")
    assert (job.image, job.node_selector) == ("registry.example/ampbench:2", {"gpu": "h200"})
    assert (job.config_map, job.secret) == ("cm", "keys")


def test_several_nodes_from_a_pod_need_a_checkpoint_dir_on_s3(
    calls: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POD_ENV, "pod-1")
    with pytest.raises(AmpbenchError, match=r"^num_nodes 2: checkpoint_dir /mnt/ck is not on S3"):
        run_train_task(
            config(), Path("r"), Path("m"), None, Placement(num_nodes=2), "/mnt/ck", 0, "run-7"
        )
    assert not calls
