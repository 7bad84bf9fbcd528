"""`ampbench submit` and `ampbench upload` against a local stand-in for the KFP v2beta1 API."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import kfp
import pytest
import yaml
from kfp_standin import KfpStandIn
from services import closed_port

from ampbench import DEFAULT_IMAGE
from ampbench.cli import build_parser, main, parameter_options
from ampbench.matrix import matrix_runs
from ampbench.pipelines import client
from ampbench.pipelines.compile import compile_pipeline

TOKEN = "tok-S3CRET-4b1d-kfp"
AWS_SECRET = "aws-S3CRET-9f2e-value"
RUNS = "/apis/v2beta1/runs"
UPLOAD = "/apis/v2beta1/pipelines/upload"
KFP_ENV = (
    "KF_PIPELINES_ENDPOINT",
    "KF_PIPELINES_UI_ENDPOINT",
    "KF_PIPELINES_SA_TOKEN_PATH",
    "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME",
    "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME",
    "KF_PIPELINES_IAP_OAUTH2_CLIENT_ID",
    "KF_PIPELINES_APP_OAUTH2_CLIENT_ID",
    "KF_PIPELINES_APP_OAUTH2_CLIENT_SECRET",
)


@pytest.fixture(autouse=True)
def isolated_kfp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No KFP settings, context file or in-cluster token of this machine; a secret in env."""
    for name in KFP_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(client, "IN_CLUSTER_TOKEN_PATHS", ())
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.setattr(kfp.Client, "_NAMESPACE_PATH", str(tmp_path / "no-pod-namespace"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)


@pytest.fixture
def standin() -> Iterator[KfpStandIn]:
    with KfpStandIn() as server:
        yield server


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def expected_spec(tmp_path: Path, image: str, schedule: str) -> dict:
    """The compiled YAML as kfp.Client sends it: the pipeline spec, with any platform spec."""
    package = compile_pipeline(tmp_path / "expected.yaml", image, schedule)
    docs = list(yaml.safe_load_all(package.read_text()))
    if len(docs) == 1:
        return docs[0]
    return {"pipeline_spec": docs[0], "platform_spec": docs[1]}


def assert_one_line_error(code: int, out: str, err: str, *fragments: str) -> str:
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ampbench: error: ")
    assert "Traceback" not in err
    assert TOKEN not in out + err
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


# -- submitting ---------------------------------------------------------------------------------
def test_submit_sends_the_compiled_spec_typed_parameters_and_the_token(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn, token_file: Path, tmp_path: Path
) -> None:
    code, out, err = cli(
        capsys,
        *("submit", "--host", standin.url, "--token-file", str(token_file)),
        *("--kfp-experiment", "amp-study", "--run-name", "first"),
        *("--image", "registry.example/ampbench:test", "--schedule", "sequential"),
        *("--epochs", "3", "--lr", "1", "--seeds", "0,1,2", "--no-tracking"),
        *("--experiment", "mlflow-exp", "--models", "small-cnn"),
    )
    assert code == 0, err
    (create,) = standin.matching("POST", RUNS)
    body = create.json()
    assert body["pipeline_spec"] == expected_spec(
        tmp_path, "registry.example/ampbench:test", "sequential"
    )
    assert body["display_name"] == "first"
    parameters = body["runtime_config"]["parameters"]
    assert parameters == {
        "epochs": 3,
        "lr": 1.0,
        "runs": matrix_runs(["small-cnn"], [128], ["amp"], [0, 1, 2]),
        "tracking": False,
        "experiment": "mlflow-exp",
    }
    assert type(parameters["epochs"]) is int
    assert type(parameters["lr"]) is float
    assert all(type(run["seed"]) is int for run in parameters["runs"])
    assert type(parameters["tracking"]) is bool
    # The KFP experiment was made under its own name and holds the run.
    (experiment,) = standin.experiments.values()
    assert experiment["display_name"] == "amp-study"
    assert body["experiment_id"] == experiment["experiment_id"]
    run_id = next(iter(standin.runs))
    assert out.strip() == (
        f"submitted run 'first' ({run_id}): {standin.url}/#/runs/details/{run_id}"
    )
    assert err == ""
    # Every request carried the token as a bearer token; no secret is in any body.
    assert standin.requests
    for request in standin.requests:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert TOKEN.encode() not in request.body
        assert AWS_SECRET.encode() not in request.body
        assert AWS_SECRET not in str(request.headers)
    assert TOKEN not in out + err


def test_submit_sends_only_the_parameters_given(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    code, _, err = cli(capsys, "submit", "--host", standin.url)
    assert code == 0, err
    (create,) = standin.matching("POST", RUNS)
    assert create.json()["runtime_config"].get("parameters", {}) == {}
    assert "authorization" not in create.headers  # no token anywhere: none sent
    # The default KFP experiment.
    assert [e["display_name"] for e in standin.experiments.values()] == ["ampbench"]


def test_the_matrix_lists_fill_in_as_run_fills_them(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    """A list not given is the default experiment's (the AMP arm; TrainConfig's model, batch
    and seed), against the baseline given: `run` makes its matrix by the same function."""
    argv = ("submit", "--host", standin.url, "--baseline-precision", "bf16", "--seeds", "3,4")
    code, _, err = cli(capsys, *argv)
    assert code == 0, err
    (create,) = standin.matching("POST", RUNS)
    assert create.json()["runtime_config"]["parameters"] == {
        "baseline_precision": "bf16",
        "runs": matrix_runs(["resnet18"], [128], ["amp"], [3, 4], "bf16"),
    }


def test_submit_offers_every_pipeline_parameter(tmp_path: Path) -> None:
    """New pipeline parameters become options by themselves: compare with the compiled spec."""
    spec = expected_spec(tmp_path, "image:1", "parallel")
    root = spec.get("pipeline_spec", spec)["root"]["inputDefinitions"]["parameters"]
    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    submit_parser = commands.choices["submit"]
    dests = {a.dest for a in submit_parser._actions}
    assert {f"pipeline_param_{name}" for name in root} <= dests
    flags = {flag for a in submit_parser._actions for flag in a.option_strings}
    assert {"--kfp-experiment", "--experiment", "--seeds", "--no-tracking"} <= flags


def test_new_parameters_get_options_that_do_not_clash() -> None:
    """Leaves the experiment may gain: a clash with a submit option gets a --param- flag, a
    flag of its own (run's) comes first with the parameter's name beside it, and each is read by
    its own parser."""
    from ampbench.argtypes import json_list, json_object
    from ampbench.experiment import Parameter

    def leaf(name: str, default: object, parse: object, flag: str = "") -> Parameter:
        flag = flag or name.replace("_", "-")
        return Parameter(name, type(default), default, "a leaf", parse, flag, section="x")  # type: ignore[arg-type]

    parser = argparse.ArgumentParser()
    parser.add_argument("--image")
    parameters = [
        leaf("image", "x", str),
        leaf("node_selector", {}, json_object),
        leaf("checkpoint_dir", "", str),
        leaf("resume", False, bool),
        leaf("weights", [], json_list),
        leaf("registered_name", "", str, flag="register"),
    ]
    parameter_options.add_pipeline_options(parser, parameters)
    args = parser.parse_args(
        [
            *("--image", "a", "--param-image", "b", "--node-selector", '{"gpu": "h100"}'),
            *("--checkpoint-dir", "s3://b/c", "--resume", "--weights", '[0.5, 1, "x"]'),
            *("--register", "m"),
        ]
    )
    given = {
        p.name: getattr(args, parameter_options.dest(p))
        for p in parameters
        if hasattr(args, parameter_options.dest(p))
    }
    assert args.image == "a"
    assert given == {
        "image": "b",
        "node_selector": {"gpu": "h100"},
        "checkpoint_dir": "s3://b/c",
        "resume": True,
        "weights": [0.5, 1, "x"],
        "registered_name": "m",
    }
    by_name = parser.parse_args(["--registered-name", "n"])
    assert getattr(by_name, parameter_options.dest(parameters[-1])) == "n"
    assert not hasattr(parser.parse_args([]), "pipeline_param_resume")
    with pytest.raises(SystemExit):
        parser.parse_args(["--weights", "0.5,1"])


def test_submit_takes_host_from_env_and_a_service_account_token(
    capsys: pytest.CaptureFixture[str],
    standin: KfpStandIn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sa_token = tmp_path / "sa-token"
    sa_token.write_text("sa-token-value\n")
    monkeypatch.setenv("KF_PIPELINES_ENDPOINT", standin.url)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(sa_token))
    code, _, err = cli(capsys, "submit")
    assert code == 0, err
    assert {r.headers.get("authorization") for r in standin.requests} == {"Bearer sa-token-value"}


def test_multi_user_needs_a_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    with KfpStandIn(multi_user=True) as server:
        code, out, err = cli(capsys, "submit", "--host", server.url)
        assert_one_line_error(code, out, err, "multi-user", "--namespace")
        assert server.runs == {}
        code, _, err = cli(capsys, "submit", "--host", server.url, "--namespace", "team-a")
        assert code == 0, err
        (experiment,) = server.experiments.values()
        assert experiment["namespace"] == "team-a"


def test_wait_polls_until_the_run_succeeds(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    standin.run_states = ["PENDING", "RUNNING", "SUCCEEDED"]
    code, out, err = cli(
        capsys, "submit", "--host", standin.url, "--wait", "--poll-interval", "0.01"
    )
    assert code == 0, err
    run_id = next(iter(standin.runs))
    assert len(standin.matching("GET", f"{RUNS}/{run_id}")) == 3
    assert f"({run_id}) SUCCEEDED" in out


def test_wait_reports_a_failed_run_in_one_line(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn, token_file: Path
) -> None:
    standin.run_states = ["RUNNING", "FAILED"]
    code, out, err = cli(
        capsys,
        *("submit", "--host", standin.url, "--token-file", str(token_file), "--run-name", "r"),
        *("--wait", "--poll-interval", "0.01"),
    )
    run_id = next(iter(standin.runs))
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("ampbench: error:")]
    assert errors == [err.strip().splitlines()[-1]]
    assert f"run 'r' ({run_id}) ended FAILED: {standin.run_error}" in errors[0]
    assert "Traceback" not in err
    assert TOKEN not in out + err


@pytest.mark.parametrize("state", ["CANCELED", "SKIPPED"])
def test_wait_fails_on_a_run_that_ends_without_succeeding(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn, state: str
) -> None:
    """A canceled or skipped run is an end, not a success and not a state to wait on: one line
    naming the run and its state, exit 1, after the poll that saw it (the --timeout only turns
    a wait that would hang into a failure)."""
    standin.run_states = ["RUNNING", state]
    code, out, err = cli(
        capsys,
        *("submit", "--host", standin.url, "--run-name", "r", "--wait"),
        *("--poll-interval", "0.01", "--timeout", "30"),
    )
    run_id = next(iter(standin.runs))
    assert code == 1, out + err
    errors = [line for line in err.splitlines() if line.startswith("ampbench: error:")]
    assert errors == [err.strip().splitlines()[-1]], err
    url = f"{standin.url}/#/runs/details/{run_id}"
    assert f"run 'r' ({run_id}) ended {state}; see {url}" in errors[0]
    assert "Traceback" not in err and out == ""
    assert len(standin.matching("GET", f"{RUNS}/{run_id}")) == 2


def test_wait_gives_up_after_the_timeout(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    standin.run_states = ["RUNNING"]
    code, _, err = cli(
        capsys,
        *("submit", "--host", standin.url, "--wait", "--timeout", "0.05"),
        *("--poll-interval", "0.01"),
    )
    assert code == 1
    assert "is still RUNNING after 0.05 s" in err.strip().splitlines()[-1]


def test_timeout_needs_wait(capsys: pytest.CaptureFixture[str], standin: KfpStandIn) -> None:
    code, out, err = cli(capsys, "submit", "--host", standin.url, "--timeout", "5")
    assert_one_line_error(code, out, err, "--timeout")
    assert standin.requests == []


def test_bad_parameter_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for option, value in (("--epochs", "2.5"), ("--seeds", "0,x"), ("--lr", "fast")):
        with pytest.raises(SystemExit) as exit_info:
            main(["submit", "--host", "http://127.0.0.1:9", option, value])
        assert exit_info.value.code == 2
        assert value in capsys.readouterr().err


# -- uploading ----------------------------------------------------------------------------------
def test_upload_creates_a_pipeline_then_versions(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn, token_file: Path, tmp_path: Path
) -> None:
    base = ("upload", "--host", standin.url, "--token-file", str(token_file))
    code, out, err = cli(capsys, *base)
    assert code == 0, err
    (pipeline,) = standin.pipelines.values()
    assert pipeline["display_name"] == "ampbench"
    assert pipeline["description"].startswith("Automatic mixed precision")
    (upload,) = standin.matching("POST", UPLOAD)
    assert upload.param("name") == "ampbench"
    package = upload.files()["uploadfile"]
    uploaded = list(yaml.safe_load_all(package))
    compiled = list(
        yaml.safe_load_all(
            compile_pipeline(tmp_path / "upload.yaml", DEFAULT_IMAGE, "parallel").read_text()
        )
    )
    assert uploaded == compiled
    assert out.strip().startswith(f"uploaded pipeline 'ampbench' ({pipeline['pipeline_id']})")

    code, out, err = cli(capsys, *base, "--version", "v2")
    assert code == 0, err
    (lookup,) = standin.matching("GET", "/apis/v2beta1/pipelines")[-1:]
    assert '"ampbench"' in (lookup.param("filter") or "")
    (version_upload,) = standin.matching("POST", UPLOAD + "_version")
    assert version_upload.param("pipelineid") == pipeline["pipeline_id"]
    assert version_upload.param("name") == "v2"
    assert "uploaded version 'v2'" in out

    code, out, err = cli(capsys, *base)  # no --version: a generated, distinct name
    assert code == 0, err
    names = [v["display_name"] for v in standin.versions.values()]
    assert len(names) == 3 == len(set(names))
    for request in standin.requests:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert TOKEN.encode() not in request.body
        assert AWS_SECRET.encode() not in request.body


def test_upload_refuses_a_name_that_two_pipelines_share(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    """Which of two pipelines named alike should get the new version is not submit's to guess:
    it names both and changes nothing."""
    for pipeline_id in ("pipeline-b", "pipeline-a"):
        standin.pipelines[pipeline_id] = {
            "pipeline_id": pipeline_id,
            "display_name": "ampbench",
            "name": "ampbench",
            "created_at": "2025-01-01T00:00:00Z",
        }
    standin.pipelines["pipeline-c"] = {**standin.pipelines["pipeline-a"], "display_name": "other"}
    standin.pipelines["pipeline-c"]["pipeline_id"] = "pipeline-c"
    code, out, err = cli(capsys, "upload", "--host", standin.url, "--version", "v2")
    line = assert_one_line_error(
        code, out, err, "2 pipelines are named 'ampbench'", "pipeline-a, pipeline-b", "--name"
    )
    assert standin.url in line and "pipeline-c" not in line
    assert standin.matching("POST", UPLOAD) == standin.matching("POST", UPLOAD + "_version") == []
    assert standin.versions == {}


# -- errors -------------------------------------------------------------------------------------
LOGIN_PAGE_CASES = [
    # (command, extra arguments, method, path): the path prefix that answers the login page
    ("submit", (), None, None),  # the whole host: healthz is the first call
    ("submit", ("--namespace", "team-a"), None, None),  # no healthz: listing experiments first
    ("submit", (), "POST", "/apis/v2beta1/experiments"),
    ("submit", (), "POST", RUNS),
    ("submit", ("--wait", "--poll-interval", "0.01", "--timeout", "30"), "GET", RUNS + "/"),
    ("upload", (), None, None),
    ("upload", (), "GET", "/apis/v2beta1/pipelines"),
    ("upload", (), "POST", UPLOAD),
    ("upload", ("--version", "v2"), "POST", UPLOAD + "_version"),
]


@pytest.mark.parametrize(
    ("command", "extra", "method", "path"),
    LOGIN_PAGE_CASES,
    ids=[f"{c[0]}-{c[2] or 'any'}-{c[3] or 'host'}{'-ns' if c[1][:1] == ('--namespace',) else ''}"
         for c in LOGIN_PAGE_CASES],
)  # fmt: skip
def test_a_login_page_instead_of_the_api_is_one_line(
    capsys: pytest.CaptureFixture[str],
    standin: KfpStandIn,
    token_file: Path,
    command: str,
    extra: tuple[str, ...],
    method: str | None,
    path: str | None,
) -> None:
    """An authenticating proxy answers 200 and its sign-in page: that is no pipeline, run or
    run state, and no reason to go on (or to wait for ever)."""
    if path == UPLOAD + "_version":
        code, _, err = cli(capsys, "upload", "--host", standin.url)  # the pipeline, first
        assert code == 0, err
    standin.login_page(method=method, path=path)
    argv = [command, "--host", standin.url, "--token-file", str(token_file), *extra]
    code, out, err = cli(capsys, *argv)
    errors = [line for line in err.splitlines() if line.startswith("ampbench: error:")]
    assert errors == [err.strip().splitlines()[-1]], err
    assert code == 1 and "Traceback" not in err and TOKEN not in out + err
    assert f"{standin.url} answered an HTML page" in errors[0]
    assert "login page" in errors[0] and "--host" in errors[0]
    assert out == ""
    assert standin.matching("POST", RUNS)[1:] == []  # nothing done twice
    if method == "GET" and path == RUNS + "/":
        assert len(standin.matching("GET", path + next(iter(standin.runs)))) == 1


@pytest.mark.parametrize(
    ("status", "hint"),
    [(401, "--token-file"), (403, "--namespace"), (404, "--host"), (500, "Internal Server Error")],
)
@pytest.mark.parametrize("namespace", [None, "team-a"])  # None: healthz first; else experiments
def test_http_errors_are_one_line(
    capsys: pytest.CaptureFixture[str],
    standin: KfpStandIn,
    token_file: Path,
    status: int,
    hint: str,
    namespace: str | None,
) -> None:
    standin.fail(status)
    argv = ["submit", "--host", standin.url, "--token-file", str(token_file)]
    argv += ["--namespace", namespace] if namespace else []
    code, out, err = cli(capsys, *argv)
    line = assert_one_line_error(code, out, err, standin.url, f"answered {status}", hint)
    assert ("healthz" in line) == (namespace is None)
    assert len(standin.requests) == 1  # no retries
    if status == 403:
        assert "team-a" in line or namespace is None


def test_http_error_when_creating_the_run(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    standin.fail(404, method="POST", path=RUNS, message="experiment gone")
    code, out, err = cli(capsys, "submit", "--host", standin.url)
    assert_one_line_error(code, out, err, "404", "submitting the run", "experiment gone")


def test_unauthorized_without_a_token(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn
) -> None:
    standin.fail(401)
    code, out, err = cli(capsys, "upload", "--host", standin.url)
    assert_one_line_error(code, out, err, "no token was sent", "--token-file")


def test_upload_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn, token_file: Path
) -> None:
    standin.fail(403, method="POST", path=UPLOAD)
    code, out, err = cli(capsys, "upload", "--host", standin.url, "--token-file", str(token_file))
    assert_one_line_error(code, out, err, "403", "uploading pipeline 'ampbench'")


@pytest.mark.parametrize("command", ["submit", "upload"])
def test_unreachable_host(
    capsys: pytest.CaptureFixture[str], token_file: Path, command: str
) -> None:
    with closed_port() as port:  # bound, not listening: refused for the whole test
        host = f"http://127.0.0.1:{port}"
        code, out, err = cli(capsys, command, "--host", host, "--token-file", str(token_file))
    assert_one_line_error(code, out, err, f"cannot reach Kubeflow Pipelines at {host}")
    assert "connection refused" in err


def test_no_host(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "submit")
    assert_one_line_error(code, out, err, "--host", "KF_PIPELINES_ENDPOINT")


def test_unreadable_token_file(
    capsys: pytest.CaptureFixture[str], standin: KfpStandIn, tmp_path: Path
) -> None:
    missing = tmp_path / "absent"
    code, out, err = cli(capsys, "submit", "--host", standin.url, "--token-file", str(missing))
    assert_one_line_error(code, out, err, str(missing))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    code, out, err = cli(capsys, "submit", "--host", standin.url, "--token-file", str(empty))
    assert_one_line_error(code, out, err, "empty")
    assert standin.requests == []
