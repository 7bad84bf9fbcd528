"""`ampbench train` under torchrun on this CPU: two gloo processes train what one process
trains with their global batch, a killed rank ends the job and a rerun resumes it, and the
gradient all-reduce precision is an arm setting.

The model is a user's factory with no BatchNorm (whose statistics are per process under DDP,
so no multi-process run can match a single one with them); it sleeps in each forward pass so
that a rank can be killed mid-run on any CPU, which changes no figure but the time."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import torch
from children import ChildOutput, assert_resumed_mid_epoch, wait_for_checkpoint
from k8s_standin import StandIn

from ampbench.cluster import CONFIG_MAP_KEYS, SECRET_KEYS
from ampbench.components.train.component import DEFAULTS
from ampbench.components.train.component import train as train_component
from ampbench.errors import ERROR_FILE_ENV, AmpbenchError, read_step_errors
from ampbench.pipelines.compile import compile_pipeline
from ampbench.results import ArmResults, read_arm_results
from ampbench.train import trainjob_run
from ampbench.train.config import TrainConfig
from ampbench.train.launch import HANDLED_SIGNALS, HandOff, train_in_processes, train_on_nodes
from ampbench.train.tracker import TrackingOptions
from ampbench.train.trainjob import TrainJobSpec, manifest
from ampbench.train.trainjob_run import CREATION_MARK

MODEL = "ddp_user_model:slow_tiny_convnet"
MODULE = """
import time

from torch import nn


class Sleep(nn.Module):
    def forward(self, x):
        time.sleep(0.05)
        return x


def slow_tiny_convnet(num_classes, image_shape):
    channels, _, _ = image_shape
    return nn.Sequential(
        Sleep(),
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, num_classes),
    )
"""
# 400 images: 10 steps of 40 per epoch, for one process or for two of 20.
SUBSET, GLOBAL_BATCH, WORLD = 400, 40, 2
# Below the default 0.1, at which this model's training on the synthetic stripes is unstable
# enough that summation order (one process against two) shows in the losses.
LR = 0.02
LEARNING = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    user = tmp_path_factory.mktemp("user")
    (user / f"{MODEL.split(':')[0]}.py").write_text(MODULE)
    path = os.pathsep.join(filter(None, [str(user), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def train_command(
    dataset: Path, out: Path, *extra: str, world: int = WORLD, verbose: bool = False
) -> list[str]:
    launcher = [sys.executable]
    if world > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    return [
        *launcher, "-m", "ampbench.cli", *(["-v"] if verbose else []), "train",
        "--dataset", str(dataset),
        "--precision", "fp32", "--model", MODEL, "--epochs", "2", "--lr", str(LR),
        "--batch-size", str(GLOBAL_BATCH // world), "--subset", str(SUBSET), "--device", "cpu",
        "--deterministic", "--no-tracking", "--output-dir", str(out), *extra,
    ]  # fmt: skip


def run(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def learning(results: dict[str, Any]) -> list[list[float]]:
    return [[epoch[key] for key in LEARNING] for epoch in results["epochs"]]


@pytest.fixture(scope="module")
def two_ranks(
    synthetic_dataset: Path, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """One uninterrupted torchrun run of two processes."""
    out = tmp_path_factory.mktemp("two-ranks")
    stdout = run(train_command(synthetic_dataset, out), env)
    return {"stdout": stdout, "results": json.loads((out / "results.json").read_text())}


def test_two_gloo_processes_train_what_one_process_trains_with_their_global_batch(
    synthetic_dataset: Path, env: dict[str, str], two_ranks: dict[str, Any], tmp_path: Path
) -> None:
    run(train_command(synthetic_dataset, tmp_path, world=1), env)
    single = json.loads((tmp_path / "results.json").read_text())
    ddp = two_ranks["results"]
    assert ddp["distributed"] == {
        "world_size": 2,
        "per_rank_batch": 20,
        "global_batch": 40,
        "backend": "gloo",
        "grad_comm": "fp32",
    }
    assert single["distributed"]["world_size"] == 1 and single["distributed"]["backend"] is None
    assert ddp["timing"]["trained_images"] == single["timing"]["trained_images"] == 800
    # The same samples, crops and flips per step; only the order of float sums differs.
    for ours, theirs in zip(learning(ddp), learning(single), strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)
    # FLOPs of the global step either way.
    assert ddp["compute"]["flops_per_step"] == single["compute"]["flops_per_step"]
    # Rank 0 alone speaks and writes.
    assert two_ranks["stdout"].count("-> ") == 1


def test_a_killed_rank_ends_the_job_and_a_rerun_resumes_it(
    synthetic_dataset: Path, env: dict[str, str], two_ranks: dict[str, Any], tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    args = ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3")
    job = subprocess.Popen(
        train_command(synthetic_dataset, tmp_path / "killed", *args, verbose=True),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = ChildOutput(job)
    # Kill rank 1 once rank 0's log says the first checkpoint (step 3 of 10 an epoch) is written.
    assert wait_for_checkpoint(output).parent == checkpoints
    rank_1 = [
        process
        for process in psutil.Process(job.pid).children(recursive=True)
        if process.environ().get("RANK") == "1"
    ]
    assert len(rank_1) == 1
    rank_1[0].send_signal(signal.SIGKILL)
    job.wait(timeout=120)
    text = output.rest()
    assert job.returncode != 0, text  # torchrun stops the other rank and fails
    # ...having seen rank 1 die of the SIGKILL (torchrun's own report of its worker).
    assert f"Signal 9 (SIGKILL) received by PID {rank_1[0].pid}" in text, text
    assert not (tmp_path / "killed" / "results.json").exists()

    resume = train_command(synthetic_dataset, tmp_path / "resumed", *args, "--resume")
    done = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_resumed_mid_epoch(done.stderr)
    resumed = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert resumed["resumed_from"] is not None
    assert resumed["distributed"]["world_size"] == 2
    for ours, theirs in zip(learning(resumed), learning(two_ranks["results"]), strict=True):
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-7)

    # A checkpoint of two processes does not continue a run of one.
    single = subprocess.run(
        train_command(synthetic_dataset, tmp_path / "one", *args, "--resume", world=1),
        env=env,
        capture_output=True,
        text=True,
    )
    assert single.returncode == 1
    assert "checkpoint belongs to a different run" in single.stderr.strip().splitlines()[-1]


def test_gradients_all_reduced_in_bf16_are_recorded_and_stay_close(
    synthetic_dataset: Path, env: dict[str, str], two_ranks: dict[str, Any], tmp_path: Path
) -> None:
    run(train_command(synthetic_dataset, tmp_path, "--grad-comm", "bf16"), env)
    compressed = json.loads((tmp_path / "results.json").read_text())
    assert compressed["distributed"]["grad_comm"] == "bf16"
    assert compressed["hyperparameters"]["grad_comm"] == "bf16"
    fp32, bf16 = learning(two_ranks["results"]), learning(compressed)
    assert bf16 != fp32  # the hook ran: bf16 rounding moved the trajectory
    for ours, theirs in zip(bf16, fp32, strict=True):
        assert ours == pytest.approx(theirs, rel=0.05, abs=0.02)


class Output(SimpleNamespace):
    """A KFP output artifact, as the train component's function uses it."""

    def log_metric(self, name: str, value: float) -> None:
        self.logged[name] = value


def train_task(dataset: Path, folder: Path, **settings: Any) -> dict[str, Output]:
    """The train component's function, called as the KFP executor calls it (an amp arm,
    untracked, unless `settings` say otherwise); its outputs in `folder`."""
    outputs = {
        name: Output(path=str(folder / name), metadata={}, logged={})
        for name in ("model", "metrics", "results", "trace")
    }
    train_component.python_func(
        dataset=SimpleNamespace(path=str(dataset)),
        **outputs,
        **{**DEFAULTS, "precision": "amp", "tracking": False, **settings},
    )
    return outputs


def test_the_train_task_with_two_gpus_trains_in_two_processes_through_torchrun(
    synthetic_dataset: Path,
    env: dict[str, str],
    two_ranks: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipeline's train task with gpu_count 2 (here gloo: no GPU): torchrun's Python
    entry point, then the arm's outputs collected as the task's own."""
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    outputs = train_task(
        synthetic_dataset,
        tmp_path,
        precision="fp32",
        epochs=2,
        batch_size=GLOBAL_BATCH // WORLD,
        subset=SUBSET,
        model_name=MODEL,
        lr=LR,
        deterministic=True,
        requested_gpu_count=WORLD,
    )
    results = read_arm_results(tmp_path / "results")
    assert results.distributed is not None and results.distributed.world_size == WORLD
    assert results.distributed.per_rank_batch == GLOBAL_BATCH // WORLD
    assert outputs["metrics"].logged["accuracy"] == results.accuracy
    state = torch.load(tmp_path / "model", weights_only=True)
    assert set(state) == {"1.weight", "1.bias", "5.weight", "5.bias"}
    ours = [[getattr(epoch, key) for key in LEARNING] for epoch in results.epochs]
    for mine, theirs in zip(ours, learning(two_ranks["results"]), strict=True):
        assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-7)


def test_a_failed_training_process_is_one_line(
    synthetic_dataset: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = TrainConfig(synthetic_dataset, precision="fp32", model="small-cnn", batch_size=600)
    handlers = [signal.getsignal(signum) for signum in HANDLED_SIGNALS]
    with pytest.raises(AmpbenchError) as raised:
        train_in_processes(config, WORLD, tmp_path / "results", tmp_path / "model", None)
    # torchrun's agent replaces them; a Ctrl-C after it would be its exception, not ours.
    assert [signal.getsignal(signum) for signum in HANDLED_SIGNALS] == handlers
    # Whichever process stopped first, with the processes' own one-line reason: 2 x 600
    # images a step, from 1,000.
    expected = "--batch-size 600 x 2 processes (a global batch of 1,200): larger than the 1,000"
    assert re.fullmatch(
        r"torchrun: training process [01] of 2 failed \(exit code 1\): \S+: "
        + re.escape(expected)
        + ".*",
        str(raised.value),
    )
    assert expected in capfd.readouterr().err


@pytest.mark.parametrize(
    ("stop_signal", "returncode", "last_line"),
    [(signal.SIGINT, 130, "train-fp32: interrupted"), (signal.SIGTERM, 128 + signal.SIGTERM, "")],
)
def test_a_signal_stops_the_training_processes_and_the_launcher_in_its_own_way(
    synthetic_dataset: Path,
    env: dict[str, str],
    tmp_path: Path,
    stop_signal: signal.Signals,
    returncode: int,
    last_line: str,
) -> None:
    """A signal to the process that started torchrun (a train task, as the component runs it)
    stops the training processes and ends it as ampbench's own ending (Ctrl-C: one line and
    130; SIGTERM: exit status 143), never as torchrun's SignalException."""
    checkpoints = tmp_path / "checkpoints"
    config = TrainConfig(
        synthetic_dataset, precision="fp32", model=MODEL, epochs=20, subset=SUBSET,
        batch_size=GLOBAL_BATCH // WORLD, device="cpu", checkpoint_dir=str(checkpoints),
        checkpoint_every=1,
    )  # fmt: skip
    script = (
        "from ampbench.errors import reported_as_step\n"
        "from ampbench.train.launch import train_in_processes\n"
        "from ampbench.train.config import TrainConfig\nfrom pathlib import PosixPath\n"
        "with reported_as_step('train-fp32'):\n"
        f"    train_in_processes({config!r}, {WORLD}, PosixPath('r'), PosixPath('m'), None)\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output = ChildOutput(job)
    ranks: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not list(checkpoints.glob("*")):  # training, inside the loop
            assert job.poll() is None and time.monotonic() < deadline, output.text()
            time.sleep(0.2)
        ranks = psutil.Process(job.pid).children(recursive=True)
        assert len(ranks) == WORLD, ranks
        job.send_signal(stop_signal)  # to the launcher alone
        job.wait(timeout=60)
        text = output.rest()
        assert job.returncode == returncode, text[-3000:]
        if last_line:
            assert text.splitlines()[-1] == last_line, text[-3000:]
        assert "SignalException" not in text and "Traceback" not in text, text[-3000:]
        _, alive = psutil.wait_procs(ranks, timeout=10)
        assert not alive, alive
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):  # a launcher already reaped
            ranks = ranks or psutil.Process(job.pid).children(recursive=True)
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
        job.kill()
        job.wait()


def test_the_hand_off_to_other_processes_says_what_the_config_says(tmp_path: Path) -> None:
    """The file an arm is handed to torchrun's processes and a TrainJob's nodes in, read back
    by `ampbench train --config`, is the same TrainConfig, data set, outputs and tracking."""
    config = TrainConfig(
        Path("/data/set"),
        precision="bf16",
        epochs=3,
        batch_size=64,
        lr=0.05,
        seed=7,
        model="vit-s",
        compile=True,
        compile_cache="s3://bucket/compile-cache",
        deterministic=True,
        subset=1024,
        checkpoint_dir="s3://bucket/ckpt/run-1/vit-s-b64-bf16-seed7",
        checkpoint_every=50,
        resume=True,
        allow_emulated=True,
        target_accuracy=0.5,
        image_size=64,
        grad_comm="bf16",
        label_smoothing=0.1,
        momentum=0.8,
        weight_decay=1e-4,
        warmup_fraction=0.2,
        eval_batch_size=256,
        device="cpu",
        keep_checkpoints=2,
        max_skipped_steps=9,
        initial_loss_scale=2.0**10,
        warmup_steps=1,
        cuda_graphs=False,  # a default True is stated by its --no- form
        profile_steps=5,
    )
    # Every field is stated, so every one must round-trip.
    defaults = TrainConfig(Path())
    assert all(
        getattr(config, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(config)
    )
    tracking = TrackingOptions("exp", "run-1", "registered")
    for handed in (
        HandOff(config, "/data/set", "s3://bucket/out", tracking),
        HandOff(config, "/data/set", str(tmp_path / "out"), None),
    ):
        assert HandOff.read(handed.write(str(tmp_path))) == handed
    # Read as `ampbench train` reads it: S3 locations stay whole (a Path would merge the //).
    nodes = HandOff(config, "s3://bucket/data", "s3://bucket/out", tracking)
    read = HandOff.read(nodes.write(str(tmp_path)))
    assert (read.dataset, read.output_dir) == ("s3://bucket/data", "s3://bucket/out")


def test_a_hand_off_is_all_or_nothing_of_the_command_line(tmp_path: Path) -> None:
    handed = HandOff(TrainConfig(Path("/data/set")), "/data/set", "o", None).write(str(tmp_path))
    for arguments, error in [
        (["--config", handed, "--epochs", "3"], "--config and --epochs: give one or the other"),
        (
            ["--config", handed, "--register-model", "m"],
            "--config and --register-model: give one or the other",
        ),
        (["--precision", "fp32"], "--dataset, --output-dir: required (or --config)"),
        (
            ["--config", str(tmp_path / "none.json")],
            f"--config {tmp_path}/none.json: cannot be read",
        ),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "ampbench.cli", "train", *arguments],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.strip().startswith(f"ampbench: error: {error}"), done.stderr
    # torchrun's processes and a TrainJob's nodes run the library's worker, not the command.
    done = subprocess.run(
        [sys.executable, "-m", "ampbench.train.worker", "--config", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"ERROR: train: --config {tmp_path}/none.json: cannot be read" in done.stderr
    # Once its arm is known, a process's error is recorded under the arm's step name (where
    # torchrun's launcher reads it back into the train step's own error).
    missing = tmp_path / "no-data"
    # allow_emulated: the data is what is missing, on whatever CPU this is.
    arm = HandOff(
        TrainConfig(missing, precision="bf16", allow_emulated=True), str(missing), "o", None
    )
    error_file = tmp_path / "errors.txt"
    done = subprocess.run(
        [sys.executable, "-m", "ampbench.train.worker", "--config", arm.write(str(tmp_path))],
        capture_output=True,
        text=True,
        env={**os.environ, ERROR_FILE_ENV: str(error_file)},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (recorded,) = read_step_errors(error_file)
    assert recorded.startswith(f"train-bf16: {missing}: not a prepared dataset"), recorded
    assert f"ERROR: {recorded}" in done.stderr
    (tmp_path / "other.json").write_text('{"dataset": "d", "output_dir": "o", "config": {}}')
    with pytest.raises(
        AmpbenchError, match=r"^--config \S+other.json: not an arm's hand-off .* \(no 'tracking'\)"
    ):
        HandOff.read(str(tmp_path / "other.json"))


# -- several nodes: Kubeflow Trainer's TrainJob ---------------------------------------------------
CRD = (
    Path(__file__).parent
    / "data"
    / "kubeflow-trainer-v2.3.0"
    / "trainer.kubeflow.org_trainjobs.yaml"
)


def strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused, as the API server prunes and rejects them
    (kubernetes-validate has no CRD schemas); kubebuilder's int-or-string admits both."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: strict(value) for key, value in schema.items()}
    if schema.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema.setdefault("additionalProperties", False)
    return schema


def check_against_crd(body: dict[str, Any]) -> None:
    import jsonschema
    import yaml

    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is not in the CRD
    jsonschema.validate(body, schema)


def job_spec(**overrides: Any) -> TrainJobSpec:
    settings: dict[str, Any] = {
        "name": "ampbench-test",
        "namespace": "team-a",
        "image": "registry.example/ampbench:1",
        "arguments": [],
        "num_nodes": 2,
        "gpus_per_node": 0,
        "config_map": "ampbench-config",
        "config_map_keys": CONFIG_MAP_KEYS,
        "secret": "ampbench-s3",
        "secret_keys": SECRET_KEYS,
    }
    return TrainJobSpec(**{**settings, **overrides})


def test_the_trainjob_fits_the_pinned_crd_and_refuses_what_it_does_not_know() -> None:
    body = manifest(job_spec(gpus_per_node=8, node_selector={"gpu": "h200"}))
    check_against_crd(body)
    trainer = body["spec"]["trainer"]
    # Processes per node stated, not inferred from the GPU limit.
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    secret_refs = [
        e["valueFrom"]["secretKeyRef"]["key"]
        for e in trainer["env"]
        if "secretKeyRef" in e["valueFrom"]
    ]
    assert secret_refs == list(SECRET_KEYS)  # by reference: no key is in the object
    import jsonschema

    for broken in (
        {**body, "spec": {**body["spec"], "trainer": {**trainer, "gpus": 8}}},
        {**body, "spec": {**body["spec"], "podSpecOverrides": []}},  # Trainer v2.0's field
        {**body, "spec": {**body["spec"], "trainer": {**trainer, "numNodes": "two"}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            check_against_crd(broken)


@pytest.fixture()
def nodes_config(
    synthetic_dataset: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> TrainConfig:
    monkeypatch.setattr(trainjob_run, "POLL_S", 0.5)  # the stand-in answers at once
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the user's model, on every node
    return TrainConfig(
        synthetic_dataset,
        precision="fp32",
        model=MODEL,
        epochs=2,
        batch_size=GLOBAL_BATCH // WORLD,
        lr=LR,
        subset=SUBSET,
        device="cpu",
        deterministic=True,
    )


def train_through(api: StandIn, config: TrainConfig, tmp_path: Path) -> ArmResults:
    """train_on_nodes against the stand-in API, sharing tmp_path/shared with its "nodes"."""
    return train_on_nodes(
        config,
        job_spec(),
        str(tmp_path / "shared"),
        tmp_path / "results",
        tmp_path / "model",
        None,
        api_client=api.api_client(),
    )


def test_a_trainjob_of_two_nodes_trains_and_hands_the_arm_back(
    nodes_config: TrainConfig,
    two_ranks: dict[str, Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the stand-in API: created, node 0's log streamed into ours, Complete, outputs
    collected from the shared location, deleted; two nodes of one process each train what
    two processes of one node train."""
    with StandIn(tmp_path) as api, caplog.at_level(logging.INFO, logger="ampbench"):
        # An earlier attempt's TrainJob of the same name is still there: replaced. The API
        # server answers the first creation and the first read (is the old one gone?) with
        # 503: each is tried again. The reply to the creation after that is lost (504): sent
        # again, it finds its own TrainJob (409, with its creation mark), which is no conflict.
        api.put_earlier("ampbench-test", {CREATION_MARK: "an earlier attempt's"})
        api.unavailable_creates = 1
        api.unavailable = 1
        api.lost_replies = 1
        results = train_through(api, nodes_config, tmp_path)
        (created,) = api.created
        assert api.deleted == ["ampbench-test", "ampbench-test"]  # the old one, then ours
    messages = [record.getMessage() for record in caplog.records]
    assert "TrainJob ampbench-test exists (an earlier attempt): replacing it" in messages
    unavailable = "the server is currently unable to handle the request; trying again"
    assert f"TrainJob ampbench-test: cannot be created: {unavailable}" in messages
    assert f"TrainJob ampbench-test: cannot be read: {unavailable}" in messages
    assert "TrainJob ampbench-test: cannot be created: the request timed out; trying again" in (
        messages
    )
    assert messages.count("TrainJob ampbench-test exists (an earlier attempt): replacing it") == 1
    assert created["spec"]["activeDeadlineSeconds"] == 6 * 3600
    check_against_crd(created)
    assert created["spec"]["trainer"]["command"][:4] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--module",
    ]
    assert results.distributed is not None and results.distributed.world_size == 2
    assert read_arm_results(tmp_path / "results") == results
    node_0_lines = [
        r.getMessage() for r in caplog.records if "[ampbench-test node 0]" in r.getMessage()
    ]
    assert any("epoch 2/2 fp32" in line for line in node_0_lines)
    ours = [[getattr(epoch, key) for key in LEARNING] for epoch in results.epochs]
    for mine, theirs in zip(ours, learning(two_ranks["results"]), strict=True):
        assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-7)


def test_a_failed_trainjob_is_one_line_and_is_deleted(
    nodes_config: TrainConfig, tmp_path: Path
) -> None:
    too_big = dataclasses.replace(nodes_config, batch_size=SUBSET)  # 2 nodes x 400 > 400 images
    with StandIn(tmp_path) as api, pytest.raises(AmpbenchError) as raised:
        train_through(api, too_big, tmp_path)
    assert (
        str(raised.value)
        == "TrainJob ampbench-test: Failed (TrainingFailed: a node exited with an error)"
    )
    assert api.deleted == ["ampbench-test"]
    assert (
        "--batch-size 400 x 2 processes (a global batch of 800): larger than the 400 training "
        "images" in (tmp_path / "ampbench-test-node-0.log").read_text()
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "no-crd",
            "num_nodes 2: this cluster has no TrainJob API (trainer.kubeflow.org/v1alpha1); "
            "install Kubeflow Trainer v2.3.0 or train on one node",
        ),
        (
            "refuse",
            'TrainJob ampbench-test: refused: admission webhook "validate.trainjob.trainer.'
            'kubeflow.org" denied the request: ClusterTrainingRuntime.trainer.kubeflow.org '
            '"torch-distributed" not found',
        ),
        (
            "unavailable",
            "TrainJob ampbench-test: cannot be created: failed 5 times: the server is "
            "currently unable to handle the request",
        ),
        (
            "conflict",
            "TrainJob ampbench-test: made again by someone else while the earlier attempt's "
            "was replaced (is another attempt of this task running?): "
            'trainjobs.trainer.kubeflow.org "ampbench-test" already exists',
        ),
        (
            "lost",
            "TrainJob ampbench-test: cannot be created: failed 5 times: the server is "
            "currently unable to handle the request",
        ),
    ],
)
def test_a_trainjob_that_cannot_be_created_is_one_line(
    nodes_config: TrainConfig, tmp_path: Path, mode: str, expected: str
) -> None:
    with StandIn(tmp_path, mode) as api, pytest.raises(AmpbenchError) as raised:
        if mode == "conflict":
            api.put_earlier("ampbench-test", {})  # an earlier attempt's, with no mark
        train_through(api, nodes_config, tmp_path)
    assert str(raised.value) == expected
    # "lost": the first request made the TrainJob; the failed creation deletes it (its nodes
    # would hold GPUs). "conflict": the earlier attempt's is deleted, once.
    assert len(api.created) == (1 if mode == "lost" else 0)
    assert api.deleted == (["ampbench-test"] if mode in ("conflict", "lost") else [])


def test_several_nodes_need_a_shared_location(nodes_config: TrainConfig, tmp_path: Path) -> None:
    with pytest.raises(AmpbenchError, match=r"^num_nodes 2: needs checkpoint_dir"):
        train_on_nodes(
            nodes_config, job_spec(), "", tmp_path / "r", tmp_path / "m", None, api_client=object()
        )


def compiled_pipeline(path: Path, image: str) -> dict[str, Any]:
    import yaml

    # The pipeline spec, then the platform spec (kfp-kubernetes' settings).
    return next(yaml.safe_load_all(compile_pipeline(path, image).read_text()))


def test_the_train_task_with_two_nodes_creates_the_trainjob_the_crd_admits(
    synthetic_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline compiled with num_nodes 2 and gpu_count 8 hands the train task what it
    needs, and the task's TrainJob, as the stand-in API receives it, fits the pinned CRD."""
    image = "registry.example/ampbench:2"
    pipeline = compiled_pipeline(tmp_path / "pipeline.yaml", image)
    loop = pipeline["root"]["dag"]["tasks"]["for-loop-1"]["componentRef"]["name"]
    train_inputs = pipeline["components"][loop]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    for name, parameter in (("num_nodes", "num_nodes"), ("requested_gpu_count", "gpu_count")):
        assert train_inputs[name]["componentInputParameter"] == f"pipelinechannel--{parameter}"
    assert train_inputs["trainjob_image"]["runtimeValue"]["constant"] == image
    assert train_inputs["s3_secret"]["componentInputParameter"] == "pipelinechannel--s3_secret"

    with StandIn(tmp_path, "refuse") as api:
        monkeypatch.setattr(trainjob_run, "in_cluster_client", lambda: (api.api_client(), "team-a"))
        with pytest.raises(SystemExit):
            train_task(
                synthetic_dataset,
                tmp_path,
                checkpoint_dir=str(tmp_path / "shared"),
                pipeline_run_id="run-7",
                requested_gpu_type="nvidia.com/gpu",
                requested_gpu_count=8,
                requested_cpu="16",
                requested_memory="64Gi",
                num_nodes=2,
                trainjob_image=image,
                node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
                config_map="team-config",
                s3_secret="team-s3",
            )
    (body,) = api.refused
    check_against_crd(body)
    trainer = body["spec"]["trainer"]
    assert body["metadata"]["namespace"] == "team-a" and trainer["image"] == image
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"]["limits"] == {
        "cpu": "16",
        "memory": "64Gi",
        "nvidia.com/gpu": "8",
    }
    shared = f"{tmp_path}/shared/run-7/resnet18-b128-amp-seed0"
    assert trainer["command"][-2:] == ["--module", "ampbench.train.worker"]
    assert trainer["args"] == ["--config", f"{shared}/train.json"]
    handed = HandOff.read(f"{shared}/train.json")
    assert (handed.dataset, handed.output_dir) == (f"{shared}/dataset", f"{shared}/outputs")
    assert handed.config.checkpoint_dir == shared and handed.config.resume
    assert handed.tracking is None
    names = {
        e["valueFrom"].get("configMapKeyRef", e["valueFrom"].get("secretKeyRef"))["name"]
        for e in trainer["env"]
    }
    assert names == {"team-config", "team-s3"}
    (patch,) = body["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    assert pod["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H200"
    }


def test_in_a_pod_several_nodes_need_their_shared_location_on_s3(
    synthetic_dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # as in every pod
    with pytest.raises(SystemExit):
        train_task(
            synthetic_dataset, tmp_path, checkpoint_dir=str(tmp_path / "shared"), num_nodes=2
        )
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "is not on S3; the nodes of a TrainJob mount nothing of this pod's, so only an s3:// "
            "location reaches them"
        )
    )


def test_every_gradient_precision_has_its_hook() -> None:
    """--grad-comm's choices (ampbench.train.GRAD_COMM) are what distributed.py can apply."""
    from ampbench.train import GRAD_COMM
    from ampbench.train.config import TrainConfig
    from ampbench.train.distributed import GRAD_COMM_HOOKS

    assert tuple(GRAD_COMM_HOOKS) == GRAD_COMM
    assert GRAD_COMM_HOOKS[TrainConfig.grad_comm] is None  # the default compresses nothing
