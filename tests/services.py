"""Real services for tests: a throwaway Ceph cluster with a RADOS Gateway (S3) and MLflow servers.

Everything listens on 127.0.0.1 on free ports and lives in a pytest temporary directory (logs
included, kept by pytest for the last few sessions). The daemons are child processes of the
test session in their own process groups; they are stopped at the end of the session, on
failure too, and by a watchdog process if the session itself dies (see `_REAPER_SCRIPT`).

Fixtures (session-scoped): `rgw`, `mlflow_server` (proxied artifacts, can be stopped and
restarted), `mlflow_server_direct` (clients write artifacts to S3 themselves). Load them
with `pytest_plugins = ["services"]` in tests/conftest.py.

Without the Ceph binaries the tests that need them skip, and fail under CI=true;
scripts/install-test-services.sh installs them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
import tenacity

CEPH_BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool")
INSTALL_HINT = "run scripts/install-test-services.sh (Debian: radosgw ceph-mon ceph-osd)"
REGION = "us-east-1"
LOCALHOST = "127.0.0.1"
# Environment variables that would point a service or a client elsewhere than we mean.
_FOREIGN_ENV_PREFIXES = ("AWS_", "MLFLOW_", "CEPH_")
_NO_PROXY = "127.0.0.1,localhost"


class ServiceError(RuntimeError):
    """A test service failed to start or to answer; the message carries the log's tail."""


class PortTaken(ServiceError):
    """A service could not bind its port: something else took it after free_port() found it."""


T = TypeVar("T")
# How each server says so: Python (uvicorn, http.server), Ceph's messenger and beast, and
# torch's TCPStore (EADDRINUSE, code -98).
_ADDRESS_IN_USE = re.compile(r"address already in use|EADDRINUSE|\(98\)", re.IGNORECASE)
PORT_TRIES = 5


def free_port() -> int:
    """A port free now. Only for a server in another process, which cannot bind port 0 and
    say which it got: start it through `on_a_free_port`, as something may take the port
    first. A server in this process binds port 0 itself and reads the port back."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return sock.getsockname()[1]


def port_taken(text: str) -> bool:
    """Whether a server's output says that its address was in use."""
    return bool(_ADDRESS_IN_USE.search(text))


def on_a_free_port(start: Callable[[], T], tries: int = PORT_TRIES) -> T:
    """`start()`, which takes its ports from free_port() and raises PortTaken when one was
    taken before its server bound it; then again, on fresh ports, up to `tries` times."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(PortTaken),
        stop=tenacity.stop_after_attempt(tries),
        reraise=True,
    )
    return retrying(start)


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections for as long as the block runs: bound, so
    that no one else can take it, and not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        yield sock.getsockname()[1]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = "\n".join(text.splitlines()[-lines:])
    return f"--- last {lines} lines of {path} ---\n{tail}"


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """os.environ without AWS/MLflow/Ceph settings or proxies for localhost, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV_PREFIXES)}
    env["NO_PROXY"] = env["no_proxy"] = _NO_PROXY
    env.update(extra)
    return env


# A watchdog for sessions that end without teardown (SIGKILL, a CI timeout's SIGTERM): it
# reads "+PGID" / "-PGID" lines; at EOF on stdin, which is when the test session is gone
# however it ended, it kills the process groups still registered.
_REAPER_SCRIPT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
_reaper: subprocess.Popen[str] | None = None


def _tell_reaper(line: str) -> None:
    global _reaper
    if _reaper is None or _reaper.poll() is not None:
        if line.startswith("-"):
            return
        _reaper = subprocess.Popen(
            [sys.executable, "-c", _REAPER_SCRIPT],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,  # not hit by the terminal's Ctrl-C meant for pytest
        )
    assert _reaper.stdin is not None
    with contextlib.suppress(OSError):
        _reaper.stdin.write(line + "\n")
        _reaper.stdin.flush()


_LIVE: set[Daemon] = set()


class Daemon:
    """One long-running child process in its own process group, output into a log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        _LIVE.add(self)
        _tell_reaper(f"+{self.process.pid}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float) -> None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds (at once if 0)."""
        process = self.process
        if process is None:
            return
        first = signal.SIGTERM if grace > 0 else signal.SIGKILL
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace if grace > 0 else 10)
        # The group as well: children (uvicorn under `mlflow server`) may outlive the leader,
        # and hold the port (a connection accepted, then reset) until they are gone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        _wait(lambda: not _group_members(process.pid), timeout=10, interval=0.05)
        self.process = None
        _LIVE.discard(self)
        _tell_reaper(f"-{process.pid}")

    def check_alive(self, what: str) -> None:
        if not self.alive():
            code = self.process.returncode if self.process is not None else None
            raise ServiceError(f"{self.name} exited (status {code}) {what}\n{log_tail(self.log)}")


def _stat_fields(stat: Path) -> list[str]:
    """state, ppid, pgrp, ... of a /proc stat file; comm may contain spaces and parentheses."""
    return stat.read_text().rsplit(")", 1)[1].split()


def _group_members(pgid: int) -> list[int]:
    """Processes of a process group with a thread still alive.

    A killed multithreaded process shows its leader as a zombie while its other threads are
    still exiting and still hold its file descriptors, a listening socket among them (seen:
    a connection to a "stopped" mlflow server reset instead of refused); so every thread counts.
    """
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(_stat_fields(stat)[2]) != pgid:
                continue
            states = [_stat_fields(task)[0] for task in stat.parent.glob("task/*/stat")]
        except (OSError, IndexError):
            continue
        if any(state not in "ZX" for state in states):
            members.append(int(stat.parent.name))
    return members


@atexit.register
def _stop_leftovers() -> None:
    for daemon in list(_LIVE):
        daemon.stop(grace=0)
    if _reaper is not None and _reaper.stdin is not None:
        _reaper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            _reaper.wait(timeout=5)


def _wait(predicate: Any, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def _accepts_connections(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((LOCALHOST, port)) == 0


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, ValueError):
        return None


def _random_key(length: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


# ---------------------------------------------------------------------------------------------
# Ceph: one mon, one memstore OSD, one RADOS Gateway


def missing_ceph_binaries() -> list[str]:
    return [name for name in CEPH_BINARIES if shutil.which(name) is None]


class Rgw:
    """A throwaway Ceph cluster (mon, memstore OSD, radosgw) serving S3 on 127.0.0.1."""

    def __init__(self, root: Path, region: str = REGION) -> None:
        self.root = root
        self.region = region
        self.conf = root / "ceph.conf"
        self.logs = root / "log"
        self.mon_port = free_port()
        self.port = free_port()
        self.endpoint = f"http://{LOCALHOST}:{self.port}"
        self.access_key = "AMPB" + _random_key(16, string.ascii_uppercase + string.digits)
        self.secret_key = _random_key(40, string.ascii_letters + string.digits)
        self.user = "ampbench-test"
        self.fsid = str(uuid.uuid4())
        env = clean_env({})
        self._env = env
        argv_conf = ["-c", str(self.conf)]
        self.mon = Daemon(
            "ceph-mon",
            ["ceph-mon", *argv_conf, "-i", "a", "-f"],
            self.logs / "mon.out",
            env,
        )
        self.osd = Daemon(
            "ceph-osd", ["ceph-osd", *argv_conf, "-i", "0", "-f"], self.logs / "osd.out", env
        )
        self.rgw = Daemon(
            "radosgw",
            ["radosgw", *argv_conf, "-n", "client.rgw", "-f"],
            self.logs / "rgw.out",
            env,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """rgw, then osd, then mon. Memstore keeps nothing worth a clean shutdown: SIGKILL."""
        for daemon in (self.rgw, self.osd, self.mon):
            daemon.stop(grace=0)

    def _start(self, timeout: float) -> None:
        for sub in ("log", "run", "crash", "mon", "osd", "rgw"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._write_conf()
        monmap = self.root / "monmap"
        self._run(
            "monmaptool",
            ["--create", "--clobber", "--fsid", self.fsid],
            ["--addv", "a", f"[v1:{LOCALHOST}:{self.mon_port}]", str(monmap)],
        )
        self._run("ceph-mon", ["-c", str(self.conf), "--mkfs", "-i", "a", "--monmap", str(monmap)])
        self.mon.start()
        self._await(
            self.mon,
            lambda: self._ceph_ok("mon", "stat"),
            timeout,
            "before the monitor answered",
            self.logs / "mon.a.log",
        )

        osd_uuid = str(uuid.uuid4())
        osd_id = self._ceph("osd", "new", osd_uuid).strip()
        if osd_id != "0":
            raise ServiceError(f"ceph osd new gave id {osd_id!r}, expected 0")
        # `osd crush update on start = false` (needed with memstore): place it ourselves.
        self._ceph("osd", "crush", "add", "osd.0", "1.0", "root=default")
        self._run(
            "ceph-osd",
            ["-c", str(self.conf), "-i", "0", "--mkfs", "--osd-uuid", osd_uuid],
            log=self.logs / "osd.0.log",
        )
        self.osd.start()
        self._await(
            self.osd,
            self._osd_up,
            timeout,
            "before it was up",
            self.logs / "osd.0.log",
        )

        self.rgw.start()
        self._await(
            self.rgw,
            lambda: _http_status(self.endpoint + "/") == 200,
            timeout,
            "before it answered HTTP",
            self.logs / "client.rgw.log",
        )
        self._run(
            "radosgw-admin",
            ["-c", str(self.conf), "user", "create", "--uid", self.user, "--display-name", "t"],
            secret_args=["--access-key", self.access_key, "--secret-key", self.secret_key],
        )
        # The first bucket makes the index and data pools (seconds): pay for it here, once.
        self.make_bucket("ampbench-warmup")

    def _write_conf(self) -> None:
        root = self.root
        self.conf.write_text(
            f"""[global]
fsid = {self.fsid}
mon host = [v1:{LOCALHOST}:{self.mon_port}]
mon initial members = a
public addr = {LOCALHOST}
cluster addr = {LOCALHOST}
ms bind msgr2 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
mon warn on insecure global id reclaim allowed = false
mon warn on pool no redundancy = false
run dir = {root}/run
crash dir = {root}/crash
admin socket =
log file = {self.logs}/$name.log
log to stderr = false
err to stderr = true
mon data = {root}/mon
mon data avail warn = 1
mon data avail crit = 0
mon allow pool delete = true
mon allow pool size one = true
mon max pg per osd = 1000
# Each osdmap change (a pool, an OSD boot) waits this long for company; default 1 s.
paxos propose interval = 0.05
paxos min wait = 0.01
osd data = {root}/osd
osd objectstore = memstore
memstore device bytes = {2 * 1024**3}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd crush update on start = false
osd class update on start = false

[client.rgw]
rgw frontends = beast endpoint={LOCALHOST}:{self.port}
rgw data = {root}/rgw
rgw enable usage log = false
""",
            encoding="utf-8",
        )

    # -- helpers ------------------------------------------------------------------------------

    def _run(
        self,
        command: str,
        args: list[str],
        more: list[str] | None = None,
        *,
        secret_args: list[str] | None = None,
        log: Path | None = None,
        timeout: float = 60,
    ) -> str:
        """Run a Ceph tool; on failure the error shows the command without secret arguments."""
        shown = [command, *args, *(more or [])]
        argv = [*shown, *(secret_args or [])]
        try:
            done = subprocess.run(
                argv, env=self._env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise ServiceError(f"{' '.join(shown)}: no answer in {timeout} s") from None
        if done.returncode != 0:
            tail = "\n".join(done.stderr.splitlines()[-20:])
            extra = f"\n{log_tail(log)}" if log is not None else ""
            raise ServiceError(
                f"{' '.join(shown)} failed (status {done.returncode}):\n{tail}{extra}"
            )
        return done.stdout

    def _ceph(self, *args: str, timeout: float = 30) -> str:
        # A monitor just elected can refuse a client's first commands: under load the client
        # may send them before it has the monmap, with fsid 0 ("handle_command on fsid 0000...
        # != ..." in the monitor's log, EPERM "problem getting command descriptions" here).
        # Every command used here is idempotent, so it is sent again.
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda error: "problem getting command descriptions" in str(error)
            ),
            stop=tenacity.stop_after_attempt(5),
            wait=tenacity.wait_fixed(1),
            reraise=True,
        )
        return retrying(
            self._run,
            "ceph",
            ["-c", str(self.conf), "--connect-timeout", "10", *args],
            timeout=timeout,
        )

    def _ceph_ok(self, *args: str) -> bool:
        try:
            self._run("ceph", ["-c", str(self.conf), "--connect-timeout", "2", *args], timeout=5)
        except ServiceError:
            return False
        return True

    def _osd_up(self) -> bool:
        try:
            stat = json.loads(self._ceph("osd", "stat", "-f", "json", timeout=5))
        except (ServiceError, ValueError):
            return False
        return int(stat.get("num_up_osds", 0)) >= 1

    def _await(self, daemon: Daemon, ready: Any, timeout: float, what: str, log: Path) -> None:
        def check() -> bool:
            daemon.check_alive(f"{what}\n{log_tail(log)}")
            return bool(ready())

        try:
            if _wait(check, timeout, interval=0.25):
                return
            error = ServiceError(
                f"{daemon.name} not ready after {timeout} s ({what})\n"
                f"{log_tail(daemon.log)}\n{log_tail(log)}"
            )
        except ServiceError as exited:
            error = exited
        if port_taken(log_tail(daemon.log, 200) + log_tail(log, 200)):
            raise PortTaken(f"{daemon.name}: its port was taken\n{error}") from error
        raise error

    # -- what tests use -----------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The standard variables a boto3 client (and ampbench.storage) reads."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def mlflow_env(self) -> dict[str, str]:
        """What MLflow's own S3 client needs (a server in proxied mode, clients in direct mode).

        MLflow reads the endpoint from MLFLOW_S3_ENDPOINT_URL and gives boto3 no checksum
        settings: boto3 >= 1.36 then adds CRC checksums, which RGW 16 rejects over https
        (MissingContentLength); over plain http it accepts them. Set for safety either way.
        """
        return {
            **self.env(),
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
            "MLFLOW_BOTO_CLIENT_ADDRESSING_STYLE": "path",
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
            "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
        }

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def make_bucket(self, name: str) -> str:
        """Create a bucket (if it is not there yet); returns its name."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        client = self.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


# ---------------------------------------------------------------------------------------------
# MLflow tracking server


class MlflowServer:
    """`mlflow server` on sqlite, with artifacts in RGW; can be stopped and started again.

    mode "proxied": clients send artifacts to the server (mlflow-artifacts:/...), which writes
    them to s3://BUCKET/mlflow; clients need no S3 settings. mode "direct": runs get
    s3://BUCKET/direct/... artifact URIs and clients write there themselves, with
    `client_env()` in their environment.
    """

    def __init__(
        self, root: Path, rgw: Rgw, bucket: str, mode: Literal["proxied", "direct"]
    ) -> None:
        self.root = root
        self.rgw = rgw
        self.bucket = bucket
        self.mode = mode
        self.port = free_port()
        self.uri = f"http://{LOCALHOST}:{self.port}"
        self.backend_uri = f"sqlite:///{root / 'mlflow.db'}"
        if mode == "proxied":
            self.artifacts_uri = f"s3://{bucket}/mlflow"
            artifact_args = ["--artifacts-destination", self.artifacts_uri, "--serve-artifacts"]
        else:
            self.artifacts_uri = f"s3://{bucket}/direct"
            artifact_args = ["--default-artifact-root", self.artifacts_uri, "--no-serve-artifacts"]
        argv = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            self.backend_uri,
            "--host",
            LOCALHOST,
            "--port",
            str(self.port),
            "--workers",
            "1",
            *artifact_args,
        ]
        # Without MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false the server starts a job runner with
        # many worker processes (~1 GB).
        env = clean_env({**rgw.mlflow_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        self.daemon = Daemon(f"mlflow server ({mode})", argv, root / "server.log", env)

    @property
    def running(self) -> bool:
        return self.daemon.alive()

    def start(self, timeout: float = 120) -> None:
        """Start (or restart, same port and backend store) and wait for /health."""
        if self.running:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self.daemon.start()
        try:

            def healthy() -> bool:
                self.daemon.check_alive("before /health answered")
                return _http_status(f"{self.uri}/health") == 200

            try:
                if _wait(healthy, timeout, interval=0.25):
                    return
                error = ServiceError(
                    f"mlflow server not healthy after {timeout} s\n{log_tail(self.daemon.log)}"
                )
            except ServiceError as exited:
                error = exited
            if port_taken(log_tail(self.daemon.log, 200)):
                raise PortTaken(f"mlflow server: port {self.port} was taken\n{error}") from error
            raise error
        except BaseException:
            self.daemon.stop(grace=0)
            raise

    def stop(self, grace: float = 5) -> None:
        """Stop the server (SIGTERM, SIGKILL after `grace` s; 0: kill at once, as a crash).

        Returns once its port refuses connections, so that a test sees a server that is down,
        not one half-way through dying."""
        self.daemon.stop(grace)
        if not _wait(lambda: not _accepts_connections(self.port), timeout=10, interval=0.05):
            raise ServiceError(f"port {self.port} still accepts connections after stopping")

    @contextlib.contextmanager
    def outage(self, grace: float = 0) -> Iterator[None]:
        """The server is down inside the block and back up after it, even on failure."""
        self.stop(grace)
        try:
            yield
        finally:
            self.start()

    def client_env(self) -> dict[str, str]:
        """What a client needs in its environment besides the tracking URI."""
        return self.rgw.mlflow_env() if self.mode == "direct" else {}


# ---------------------------------------------------------------------------------------------
# Fixtures


def _require(condition: bool, reason: str) -> None:
    from conftest import require  # here, not at import: conftest may import this module

    require(condition, reason)


@pytest.fixture(scope="session")
def rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rgw]:
    """A running RADOS Gateway with a user; skips (fails under CI=true) without Ceph."""
    missing = missing_ceph_binaries()
    _require(not missing, f"Ceph is not installed (missing {', '.join(missing)}); {INSTALL_HINT}")

    def start() -> Rgw:
        service = Rgw(tmp_path_factory.mktemp("rgw"))  # new ports, a new cluster
        service.start()  # stops what it started, on failure
        return service

    service = on_a_free_port(start)
    try:
        yield service
    finally:
        service.stop()


def _mlflow_fixture(
    tmp_path_factory: pytest.TempPathFactory, rgw: Rgw, mode: Literal["proxied", "direct"]
) -> Iterator[MlflowServer]:
    bucket = rgw.make_bucket("ampbench-mlflow")

    def start() -> MlflowServer:
        server = MlflowServer(tmp_path_factory.mktemp(f"mlflow-{mode}"), rgw, bucket, mode)
        server.start()  # stops the server, on failure
        return server

    server = on_a_free_port(start)
    try:
        yield server
    finally:
        server.stop(grace=0)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, rgw: Rgw) -> Iterator[MlflowServer]:
    """MLflow server, proxied artifacts to s3://ampbench-mlflow/mlflow. A test that stops it
    must start it again (`with mlflow_server.outage(): ...` does)."""
    yield from _mlflow_fixture(tmp_path_factory, rgw, "proxied")


@pytest.fixture(scope="session")
def mlflow_server_direct(
    tmp_path_factory: pytest.TempPathFactory, rgw: Rgw
) -> Iterator[MlflowServer]:
    """MLflow server whose clients write artifacts to s3://ampbench-mlflow/direct themselves
    (with `mlflow_server_direct.client_env()` set)."""
    yield from _mlflow_fixture(tmp_path_factory, rgw, "direct")
