"""The command line: every subcommand explains itself; a user's mistake is one line, exit 1."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ampbench.cli import build_parser, main
from ampbench.cli import mlflow_commands as cli_module
from ampbench.data import sources as sources_module
from ampbench.results import read_arm_results
from ampbench.settings import Setting
from ampbench.train import precision as precision_module

COMMANDS = ["run", "compile", "submit", "upload", "prepare", "train", "compare", "report", "ui"]


def ampbench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampbench.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize("command", [*COMMANDS, None])
def test_every_command_has_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"] if command else ["--help"])
    assert exited.value.code == 0
    assert "usage: ampbench" in capsys.readouterr().out


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("ampbench: error:")]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert "RESULTS" not in captured.out
    return lines[0]


def test_run_with_a_missing_data_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # --allow-emulated: on any CPU, what is wrong here is the path.
    argv = ["run", "--data", str(tmp_path / "nope"), "--allow-emulated"]
    line = one_line_error(capsys, [*argv, "--output-dir", str(tmp_path / "o")])
    assert "nope: no such file or directory" in line
    assert not (tmp_path / "o").exists()


def test_default_run_offline_stops_at_the_download(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(
        sources_module.DOWNLOADS, "cifar10", ("http://127.0.0.1:9/cifar-10-python.tar.gz", "0")
    )
    monkeypatch.chdir(tmp_path)
    # --allow-emulated: whatever this CPU, the first thing in the way is the download.
    line = one_line_error(capsys, ["run", "--allow-emulated"])
    assert "cifar10: cannot download" in line and "local copy" in line


def test_train_on_something_that_is_not_a_dataset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = one_line_error(
        capsys,
        [
            "train",
            "--dataset",
            str(tmp_path),
            "--precision",
            "fp32",
            "--output-dir",
            str(tmp_path / "o"),
        ],
    )
    assert "not a prepared dataset" in line


def test_impossible_precision_on_cpu(
    capsys: pytest.CaptureFixture[str], synthetic_dataset: Path, tmp_path: Path
) -> None:
    line = one_line_error(
        capsys,
        [
            "train",
            "--dataset",
            str(synthetic_dataset),
            "--precision",
            "tf32",
            "--device",
            "cpu",
            "--output-dir",
            str(tmp_path / "o"),
        ],
    )
    assert "TF32 is a CUDA tensor-core mode" in line


@pytest.fixture()
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees a CPU without native bf16 (whatever CPU it runs on)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision_module, "cpu_native_features", lambda: {"AVX512_BF16": False})
    monkeypatch.setattr(precision_module, "cpu_name", lambda: "Test EPYC")


@pytest.mark.usefixtures("cpu_without_bf16")
def test_run_stops_at_once_on_a_cpu_without_native_bf16(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, ["run", "--output-dir", str(tmp_path / "o")])
    assert line.startswith("ampbench: error: --precision amp: Test EPYC has no AVX512_BF16")
    assert "--allow-emulated" in line
    assert not (tmp_path / "o").exists()  # refused before the pipeline made anything


@pytest.mark.usefixtures("cpu_without_bf16", "tiny_model")
def test_train_refuses_emulated_amp_and_labels_it_when_allowed(
    capsys: pytest.CaptureFixture[str], synthetic_dataset: Path, tmp_path: Path
) -> None:
    argv = ["train", "--dataset", str(synthetic_dataset), "--precision", "amp", "--model"]
    argv += ["small-cnn", "--epochs", "1", "--batch-size", "50", "--subset", "100"]
    argv += ["--no-tracking", "--output-dir", str(tmp_path / "o")]
    line = one_line_error(capsys, argv)
    assert "--precision amp: Test EPYC has no AVX512_BF16" in line
    assert not (tmp_path / "o").exists()
    assert main([*argv, "--allow-emulated"]) == 0
    assert "EMULATED: Test EPYC has no AVX512_BF16" in capsys.readouterr().out
    results = read_arm_results(tmp_path / "o" / "results.json")
    assert results.precision.emulated and results.precision.resolved == "bf16"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--epochs", "0"], "--epochs: must be at least 1, not 0"),
        (["run", "--batch-size", "0"], "--batch-size: must be at least 1, not 0"),
        (["run", "--precision", "fp9"], "--precision: 'fp9' is not one of fp32, tf32, "),
        (["run", "--subset", "many"], "--subset: 'many' is not a whole number"),
        (["run", "--seeds", "1,1"], "--seeds: '1,1': give one or more distinct seeds"),
        (["run", "--model", "vgg"], "--model: 'vgg' is not one of the built-in models"),
        (["run", "--max-accuracy-drop", "-2"], "must be 0 or more (or -1: off), not -2"),
        (["run", "--models", "small-cnn,vgg"], "--models: 'vgg' is not one of the built-in"),
        (["run", "--precisions", "fp16,int4"], "--precisions: 'int4' is not one of fp32, "),
        (["run", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["train", "--lr", "fast"], "--lr: 'fast' is not a number"),
        (["train", "--dataset"], "--dataset: expected one argument"),
        (["train", "--dataset", "d", "--output-dir", "o", "--device"], "--device: expected one"),
        (["prepare", "--data", "x"], "the following arguments are required: --output-dir"),
        (["prepare", "--subset", "-3", "--output-dir", "o"], "--subset: must be 0 or more"),
        (["compare", "r.json"], "the following arguments are required: --output-dir"),
        (["compare", "r.json", "--output-dir", "o", "--baseline-precision", "int8"], "'int8' is"),
        (["submit", "--models", "x:"], "--models: 'x:' is not of the form package.module:factory"),
        (["submit", "--precisions", "fp9"], "--precisions: 'fp9' is not one of fp32, "),
        # submit reads each pipeline parameter with its leaf's own parser, as run does.
        (["submit", "--grad-comm", "int8"], "--grad-comm: 'int8' is not one of fp32, "),
        (["submit", "--epochs", "0"], "--epochs: must be at least 1, not 0"),
        (["submit", "--gpu-node-selector", "h100"], "--gpu-node-selector: 'h100' is not "),
        (["submit", "--mlflow-experiment", "x"], "--mlflow-experiment is now --experiment"),
        (["compile", "--schedule", "fast"], "--schedule: 'fast' is not one of parallel, "),
        (["frobnicate"], "COMMAND: 'frobnicate' is not one of run, compile, submit"),
    ],
)
def test_an_option_mistake_is_one_line_naming_the_option(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit status 2 and one line on stderr: the command, the option and what is wrong, and
    where its help is; no usage dump, nothing on stdout."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    command = "ampbench" if argv[0] == "frobnicate" else f"ampbench {argv[0]}"
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{command}: error: ") and expected in line, line
    assert line.endswith(f"; see {command} --help") and captured.out == ""


def test_the_accuracy_gates_off_is_an_option_value() -> None:
    # The pipeline's "off" for the accuracy gate is an option value too.
    compare = ["compare", "r.json", "--output-dir", "o", "--max-accuracy-drop"]
    assert build_parser().parse_args([*compare, "-1"]).max_accuracy_drop == -1.0
    assert build_parser().parse_args([*compare, "2.5"]).max_accuracy_drop == 2.5


def test_prepare_train_compare_one_step_at_a_time(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = ampbench("prepare", "--data", "synthetic", "--subset", "100", "--output-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert "train 100, test 100" in done.stdout
    for precision in ("fp32", "bf16"):
        done = ampbench(
            "train", "--dataset", str(data), "--precision", precision, "--model", "small-cnn",
            "--epochs", "1", "--batch-size", "10", "--subset", "40", "--no-tracking",
            "--allow-emulated", "--output-dir", str(tmp_path / precision),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (tmp_path / precision / "results.json").is_file()
        assert (tmp_path / precision / "model.pt").is_file()
    done = ampbench(
        "compare", str(tmp_path / "fp32" / "results.json"), str(tmp_path / "bf16" / "results.json"),
        "--output-dir", str(tmp_path / "cmp"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "===== RESULTS =====" in done.stdout
    assert "Steady-state speedup (images/s, bf16 / fp32): " in done.stdout
    assert "Verdict: On " in done.stdout
    assert (tmp_path / "cmp" / "report.md").is_file()


@pytest.mark.usefixtures("tiny_model")
def test_compare_refuses_arms_that_differ_in_more_than_precision(
    capsys: pytest.CaptureFixture[str], synthetic_dataset: Path, tmp_path: Path
) -> None:
    for precision, lr in (("fp32", "0.1"), ("bf16", "0.05")):
        argv = ["train", "--dataset", str(synthetic_dataset), "--precision", precision]
        argv += ["--model", "small-cnn", "--epochs", "1", "--batch-size", "25", "--lr", lr]
        argv += ["--subset", "100", "--allow-emulated", "--no-tracking"]
        assert main([*argv, "--output-dir", str(tmp_path / precision)]) == 0
    capsys.readouterr()
    compare = ["compare", str(tmp_path / "fp32" / "results.json")]
    compare += [str(tmp_path / "bf16" / "results.json")]
    line = one_line_error(capsys, [*compare, "--output-dir", str(tmp_path / "c")])
    assert "lr (fp32: 0.1; bf16: 0.05)" in line and "--allow-mismatch" in line
    assert not (tmp_path / "c" / "results.json").exists()
    assert main([*compare, "--output-dir", str(tmp_path / "c"), "--allow-mismatch"]) == 0
    assert "WARNING: Compared although the arms differ" in capsys.readouterr().out


def test_compile_writes_yaml(tmp_path: Path) -> None:
    done = ampbench("compile", "-o", str(tmp_path / "p.yaml"), "--image", "example/ampbench:1")
    assert done.returncode == 0, done.stderr
    assert "example/ampbench:1" in (tmp_path / "p.yaml").read_text()


def process_group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            members.append(int(stat.parent.name))
    return members


def listening_sockets(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on 127.0.0.1:`port` (IPv4), from /proc."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and address == f"0100007F:{port:04X}":
            found.add(inode)
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_ui_serves_the_local_store_and_takes_its_server_with_it(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    import urllib.request

    from mlflow import MlflowClient
    from services import PortTaken, free_port, on_a_free_port, port_taken

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(store).create_experiment("earlier")
    experiment_id = MlflowClient(store).create_experiment("mine")
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    started: list[subprocess.Popen[str]] = []  # every try's command, to clean up after
    server_log = tmp_path / "mlflow-ui.log"

    def start() -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        # SIGINT at its default, as a terminal starts a command: a suite started in the
        # background without job control passes it ignored, and Python keeps it ignored.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            ui = subprocess.Popen(
                [sys.executable, "-m", "ampbench.cli", "ui", "--port", str(port),
                 "--experiment", "mine"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True, cwd=tmp_path,
            )  # fmt: skip
        finally:
            signal.signal(signal.SIGINT, previous)
        started.append(ui)
        wait_until_healthy(ui, port)
        return ui, port

    def wait_until_healthy(ui: subprocess.Popen[str], port: int) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    assert reply.status == 200
                    return
            except OSError:
                if ui.poll() is not None:
                    output = ui.stdout.read()  # type: ignore[union-attr]
                    output += server_log.read_text() if server_log.exists() else ""
                    if port_taken(output):
                        raise PortTaken(output) from None
                    raise AssertionError(output) from None
                assert time.monotonic() < deadline, "the MLflow UI did not answer"
                time.sleep(0.5)

    server_group = None
    try:
        ui, port = on_a_free_port(start)
        children = Path(f"/proc/{ui.pid}/task/{ui.pid}/children").read_text().split()
        assert len(children) == 1
        server_group = int(children[0])
        assert len(process_group_members(server_group)) == 2, "server and one worker"
        sockets = listening_sockets(port)
        assert sockets, f"nothing listens on port {port}"
        ui.send_signal(stop_signal)  # to the command alone, as a service manager would
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for group in (ui.pid, server_group):  # the server holds the output pipe too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
            output = ui.communicate(timeout=30)[0][-3000:]
            raise AssertionError(f"{stop_signal.name} left the command running: {output}") from None
        assert process_group_members(server_group) == [], "the server outlived the command"
        # Its listening socket is closed (whatever may listen on the port now is not it).
        assert not sockets & listening_sockets(port)
        # The runs table, not the experiment's GenAI overview that MLflow 3's UI opens on.
        table = f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs"
        terminal = ui.stdout.read()  # type: ignore[union-attr]
        assert f"runs of experiment 'mine': {table}\n" in terminal
        # The server's own lines (its start, each request) are in the file it names, not here.
        assert f"its request log in {server_log};" in terminal
        assert "/health" not in terminal and "Uvicorn" not in terminal
        assert server_log.read_text().strip()
    finally:
        for group in (*(try_.pid for try_ in started), server_group):
            if group is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        for try_ in started:
            try_.wait()


def test_ui_on_a_taken_port_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = one_line_error(capsys, ["ui", "--port", str(port)])
    assert line == (
        f"ampbench: error: --port {port}: cannot serve there (Address already in use); "
        "pass another --port"
    )


def test_a_ui_server_that_ends_by_itself_is_an_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(cli_module.sys, "executable", "/bin/true")  # a "server" that exits 0
    monkeypatch.setattr(cli_module, "_check_port_free", lambda port: None)  # nothing binds
    line = one_line_error(capsys, ["ui", "--port", "5999"])
    assert line == (
        "ampbench: error: the MLflow UI server on http://127.0.0.1:5999 stopped by itself "
        "(exit code 0)"
    )


def test_ui_refuses_a_remote_store(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:pw@mlflow.example.com")
    line = one_line_error(capsys, ["ui"])
    assert "open that server's own UI" in line and "pw@" not in line


def test_batch_larger_than_the_subset_stops_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["run", "--subset", "300", "--batch-size", "100000", "--allow-emulated"]
    line = one_line_error(capsys, [*argv, "--output-dir", str(tmp_path / "o")])
    assert "--batch-size 100000: larger than the at most 300 training images" in line
    assert not (tmp_path / "o").exists()


def test_a_setting_the_data_rules_out_fails_in_prepare_once_and_trains_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Batch 64 over a 40-image folder: only the prepared data can tell. The prepare step says
    so, once; no training task starts, so none is retried."""
    from datagen import make_image_folder

    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 20, "test": 2})
    argv = ["run", "--data", str(tmp_path / "tree"), "--batch-size", "64", "--no-tracking"]
    argv += ["--model", "small-cnn", "--allow-emulated", "--output-dir", str(tmp_path / "o")]
    line = one_line_error(capsys, argv)
    assert line.endswith("prepare: --batch-size 64: larger than the 40 training images"), line
    assert not list((tmp_path / "o").rglob("results")), "a training task ran"


@pytest.mark.parametrize("command", ["compile", "submit", "upload"])
@pytest.mark.parametrize(
    ("image", "pattern"),
    [
        ("", "empty"),
        ("Bad Image!!", "not a valid image reference"),
        ("ghcr.io/org/x:a:b", "not a valid image reference"),
        ("Org/ampbench:1", "must be lower case"),
        ("ghcr.io/org/x@sha256:short", "not a valid image reference"),
    ],
)
def test_bad_image_references_are_usage_errors(
    command: str,
    image: str,
    pattern: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # where compile would write its default output
    with pytest.raises(SystemExit) as exited:
        main([command, "--image", image])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert re.search(f"--image: .*{pattern}", err), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/ampbench/ampbench:0.1.0",
        "nginx",
        "localhost:5000/team/ampbench:dev_1.2-rc",
        "registry.example.com/a/b/c@sha256:" + "0" * 64,
        "[fd00::1]:5000/ampbench:1",
    ],
)
def test_valid_image_references_compile(image: str, tmp_path: Path) -> None:
    assert main(["compile", "--image", image, "-o", str(tmp_path / "p.yaml")]) == 0
    assert image in (tmp_path / "p.yaml").read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_default(command: str) -> None:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    subparser = commands.choices[command]
    text = "".join(subparser.format_help().split())  # argparse wraps lines, even at hyphens
    for action in subparser._actions:
        if not action.option_strings or action.default in (None, argparse.SUPPRESS):
            continue
        if isinstance(action.default, bool):
            continue
        assert action.help, f"{command} {action.option_strings[0]} has no help"
        default = action.default
        shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
        assert "default:" + "".join(shown.split()) in text, (
            f"{command} {action.option_strings[0]}: default {default!r} not shown"
        )


@pytest.mark.parametrize(
    ("option", "pattern"),
    [
        (["--lr", "-1"], "--lr: must be positive, not -1.0"),
        (["--subset", "300", "--batch-sizes", "64,100000"], "larger than the at most 300 training"),
    ],
)
@pytest.mark.parametrize("command", ["run", "submit"])
def test_training_settings_are_checked_before_anything_runs(
    command: str, option: list[str], pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistake that a training task would find is refused before the pipeline starts (no
    KFP server is named: the command must stop before it would need one)."""
    line = one_line_error(capsys, [command, *option])
    assert pattern in line


@pytest.mark.parametrize(
    ("option", "pattern"),
    [
        (["--num-nodes", "0"], "--num-nodes: must be at least 1, not 0"),
        (["--gpu-count", "-1"], "--gpu-count: must be at least 0, not -1"),
        (
            ["--subset", "100", "--batch-size", "30", "--gpu-count", "2", "--num-nodes", "2"],
            "--batch-size 30 x 4 processes (a global batch of 120): larger than the at most 100",
        ),
    ],
)
def test_submit_refuses_impossible_scales(
    option: list[str], pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pattern in one_line_error(capsys, ["submit", *option])


def test_run_passes_the_experiment_its_options_state() -> None:
    """`run` has an option per leaf of the experiment it can use (ampbench/experiment.py), and
    hands the pipeline the experiment they state: the others at the tree's defaults."""
    from ampbench.cli.pipeline_commands import _experiment, _matrix_runs
    from ampbench.experiment import Experiment, parameters

    parser = build_parser(["run"])
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = commands.choices["run"]._option_string_actions
    for leaf in parameters():
        if leaf.section in ("dataset", "training", "tracking", "comparison"):
            assert "--" + leaf.flag in flags, leaf.name
    argv = ["run", "--data", "synthetic", "--subset", "200", "--epochs", "3", "--lr", "0.05"]
    argv += ["--grad-comm", "bf16", "--checkpoint-dir", "/c", "--checkpoint-every", "5"]
    argv += ["--no-tracking", "--register-model", "m", "--experiment", "e", "--no-cuda-graphs"]
    argv += ["--allow-mismatch", "--max-accuracy-drop", "1.5", "--target-accuracy", "0.5"]
    argv += ["--image-size", "48", "--allow-emulated", "--baseline-precision", "bf16"]
    argv += ["--compile", "--deterministic", "--label-smoothing", "0.1"]
    args = parser.parse_args(argv)
    experiment = _experiment(args, _matrix_runs(args))
    stated = {
        "data": "synthetic", "subset": 200, "epochs": 3, "lr": 0.05, "grad_comm": "bf16",
        "checkpoint_dir": "/c", "checkpoint_every": 5, "tracking": False,
        "registered_model_name": "m", "experiment": "e", "cuda_graphs": False,
        "allow_mismatch": True, "max_accuracy_drop": 1.5, "target_accuracy": 0.5,
        "image_size": 48, "allow_emulated": True, "baseline_precision": "bf16",
        "compile": True, "deterministic": True, "label_smoothing": 0.1,
    }  # fmt: skip
    # No --batch-size: automatic (0), which each train task fits to the data it reads.
    runs = [
        {"model": "resnet18", "batch_size": 0, "precision": p, "seed": 0} for p in ("bf16", "amp")
    ]
    assert experiment.parameters() == Experiment().parameters() | stated | {"runs": runs}
    default = _experiment(parser.parse_args(["run"]), [])
    assert default.parameters() == Experiment().parameters() | {"runs": []}


def _another_value(setting: Setting) -> object:
    """A valid value of a TrainConfig setting other than its default."""
    others: dict[str, object] = {"model": "vit-s", "device": "cpu", "grad_comm": "bf16"}
    if setting.name in others:
        return others[setting.name]
    if setting.default is None:
        return "/checkpoints"
    if setting.type is bool:
        return not setting.default
    if setting.type is int:
        return setting.default + 1
    return round(setting.default + 0.05, 6)


def test_train_has_an_option_per_training_setting_and_reads_them_all() -> None:
    """`ampbench train`'s options are TrainConfig's settings (ampbench/settings.py): stating
    each at another value than its default gives the TrainConfig of those values."""
    from ampbench.cli.train_command import _hand_off
    from ampbench.settings import described
    from ampbench.train.config import TrainConfig
    from ampbench.train.tracker import TrackingOptions

    settings = described(TrainConfig)
    assert len(settings) == len(dataclasses.fields(TrainConfig)) - 2  # less data set, precision
    stated = {each.name: _another_value(each) for each in settings}
    argv = ["train", "--dataset", "/data", "--precision", "bf16", "--output-dir", "/out"]
    argv += ["--experiment", "e", "--register-model", "m", "--pipeline-run-id", "r"]
    for each in settings:
        value = stated[each.name]
        if isinstance(value, bool):
            argv.append(f"--{each.flag}" if value else f"--no-{each.flag}")
        else:
            argv += [f"--{each.flag}", str(value)]
    arm = _hand_off(build_parser().parse_args(argv), build_parser().parse_args(["train"]))
    assert arm.config == TrainConfig(Path("/data"), precision="bf16", **stated)
    assert (arm.dataset, arm.output_dir) == ("/data", "/out")
    assert arm.tracking == TrackingOptions("e", "r", "m")


def test_an_interrupted_step_ends_in_one_line_and_records_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ampbench.errors import ERROR_FILE_ENV, reported_as_step

    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "errors"))
    with pytest.raises(SystemExit) as ended, reported_as_step("train-fp16"):
        raise KeyboardInterrupt
    assert ended.value.code == 130
    assert capsys.readouterr().err == "train-fp16: interrupted\n"
    assert not (tmp_path / "errors").exists()  # not the user's error, for `run` to repeat
