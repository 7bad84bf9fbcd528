"""ampbench.storage against a real S3 service (Ceph RADOS Gateway, from tests/services.py)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ampbench import storage
from ampbench.errors import AmpbenchError

if TYPE_CHECKING:
    from services import Rgw

# The fixtures (rgw); importing services here instead would skip pytest's assert rewriting.
pytest_plugins = ["services"]

MIB = 1024 * 1024


@pytest.fixture
def s3(rgw: Rgw, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Rgw]:
    """The process environment pointing boto3 (and so storage.client()) at the RGW only."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    for key, value in rgw.env().items():
        monkeypatch.setenv(key, value)
    # No profile or config file of the user's may add settings (or an AWS_ENDPOINT_URL_S3).
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    storage.client.cache_clear()
    yield rgw
    storage.client.cache_clear()


@pytest.fixture
def bucket(s3: Rgw) -> str:
    return s3.make_bucket(f"t-{uuid.uuid4().hex[:16]}")


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def test_upload_small_file_is_verified_and_readable(bucket: str, tmp_path: Path) -> None:
    """Ceph 16 keeps no additional checksums: the upload is verified by its size."""
    data = b"ampbench small object\n" * 10
    uri = f"s3://{bucket}/runs/small.txt"
    assert storage.upload(write(tmp_path / "small.txt", data), uri) == "size"
    assert storage.head(uri)["ContentLength"] == len(data)
    assert storage.read_bytes(uri) == data


@pytest.mark.parametrize(
    ("size", "parts"), [(8 * MIB, 1), (8 * MIB + 12345, 2)], ids=["8MiB", "over-8MiB"]
)
def test_upload_multipart_file_is_verified(
    bucket: str, tmp_path: Path, size: int, parts: int
) -> None:
    data = os.urandom(size)
    uri = f"s3://{bucket}/checkpoints/model-{size}.pt"
    assert storage.upload(write(tmp_path / "model.pt", data), uri) == "size"
    stored = storage.head(uri)
    assert stored["ContentLength"] == size
    assert stored["ETag"].strip('"').endswith(f"-{parts}"), "not a multipart upload"
    assert hashlib.sha256(storage.read_bytes(uri)).digest() == hashlib.sha256(data).digest()


@pytest.fixture
def checksum_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """An S3 store that keeps SHA-256 checksums, which Ceph 16 does not: moto's server stands
    in for AWS S3 here (it drops the "-N" of composite checksums, as some stores do)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()  # binds port 0 in this process: the port it got is its own
    _, port = server.get_host_and_port()
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "stand-in")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stand-in")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    storage.client.cache_clear()
    storage.client().create_bucket(Bucket="checksums")
    yield "checksums"
    storage.client.cache_clear()
    server.stop()


@pytest.mark.parametrize("size", [1000, 8 * MIB, 8 * MIB + 5], ids=["small", "8MiB", "2-parts"])
def test_upload_is_verified_by_checksum_where_the_store_keeps_one(
    checksum_store: str, tmp_path: Path, size: int
) -> None:
    path = write(tmp_path / "f.bin", os.urandom(size))
    assert storage.upload(path, f"s3://{checksum_store}/f.bin") == "sha256"


def test_a_checksum_that_differs_fails_the_upload(
    checksum_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file changes between the upload and its check (as a corrupted transfer would look)."""
    path = write(tmp_path / "f.bin", b"sent")
    original = storage._upload_file

    def upload_then_change(source: Path, uri: str, checksum: bool) -> None:
        original(source, uri, checksum)
        source.write_bytes(b"else")

    monkeypatch.setattr(storage, "_upload_file", upload_then_change)
    with pytest.raises(AmpbenchError, match="SHA-256 differs from the file"):
        storage.upload(path, f"s3://{checksum_store}/f.bin")


def test_fetch_caches_by_etag_and_refetches_a_changed_object(bucket: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    uri = f"s3://{bucket}/data/archive.tar.gz"
    storage.upload(write(tmp_path / "v1", b"version one"), uri)

    first, was_cached = storage.fetch(uri, cache)
    assert not was_cached
    assert first.read_bytes() == b"version one"
    assert first.name == "archive.tar.gz"
    assert first.is_relative_to(cache)

    again, was_cached = storage.fetch(uri, cache)
    assert was_cached
    assert again == first

    storage.upload(write(tmp_path / "v2", b"version two, longer"), uri)
    changed, was_cached = storage.fetch(uri, cache)
    assert not was_cached
    assert changed != first
    assert changed.read_bytes() == b"version two, longer"
    assert storage.fetch(uri, cache) == (changed, True)
    # No partial downloads left behind next to the cached objects.
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == [
        "archive.tar.gz",
        "archive.tar.gz",
    ]


def test_fetch_tree_downloads_exactly_the_prefix(bucket: str, tmp_path: Path) -> None:
    files = {"a.txt": b"a", "sub/b.bin": b"bb", "sub/deeper/c.json": b"{}"}
    for name, data in files.items():
        storage.upload(write(tmp_path / "src" / name, data), f"s3://{bucket}/ds/train/{name}")
    # A sibling whose name merely starts like the prefix must stay out.
    storage.upload(write(tmp_path / "x", b"x"), f"s3://{bucket}/ds/train-extra/x.txt")

    cache = tmp_path / "cache"
    tree, was_cached = storage.fetch_tree(f"s3://{bucket}/ds/train", cache)
    assert not was_cached
    found = {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert found == files

    assert storage.fetch_tree(f"s3://{bucket}/ds/train/", cache) == (tree, True)

    storage.upload(write(tmp_path / "d", b"new"), f"s3://{bucket}/ds/train/d.txt")
    changed, was_cached = storage.fetch_tree(f"s3://{bucket}/ds/train", cache)
    assert not was_cached
    assert (changed / "d.txt").read_bytes() == b"new"

    with pytest.raises(AmpbenchError, match=re.escape(f"s3://{bucket}/ds/nothing: no objects")):
        storage.fetch_tree(f"s3://{bucket}/ds/nothing", cache)


def test_fetch_tree_stages_inside_the_cache(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finished tree is renamed into the cache, so it must be staged on the cache's
    filesystem: staged in /tmp (often another filesystem) the rename fails with EXDEV."""
    storage.upload(write(tmp_path / "f", b"f"), f"s3://{bucket}/tree/f.txt")
    staged: list[Path] = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: object, **kwargs: object) -> str:
        path = real_mkdtemp(*args, **kwargs)  # type: ignore[call-overload]
        staged.append(Path(path))
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    cache = tmp_path / "cache"
    tree, _ = storage.fetch_tree(f"s3://{bucket}/tree", cache)
    assert (tree / "f.txt").read_bytes() == b"f"
    assert staged
    assert all(path.is_relative_to(cache) for path in staged), staged


@pytest.mark.parametrize("shape", ["absolute", "dotdot"])
def test_fetch_tree_refuses_keys_that_leave_the_prefix(
    s3: Rgw, bucket: str, tmp_path: Path, shape: str
) -> None:
    escaped = tmp_path / "escaped.txt"
    # "evil//tmp/.../escaped.txt" leaves "/tmp/.../escaped.txt" after the prefix: absolute.
    key = f"evil/{escaped}" if shape == "absolute" else "evil/sub/../../escaped.txt"
    s3.client().put_object(Bucket=bucket, Key=key, Body=b"payload")  # legal S3 keys
    s3.client().put_object(Bucket=bucket, Key="evil/fine.txt", Body=b"fine")
    assert key in s3.list_keys(bucket)
    with pytest.raises(AmpbenchError, match="outside the prefix") as error:
        storage.fetch_tree(f"s3://{bucket}/evil", tmp_path / "cache")
    assert key in str(error.value)
    assert not escaped.exists()
    # Refused before anything was downloaded.
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_fetch_tree_another_process_finishing_first_is_a_cache_hit(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.upload(write(tmp_path / "f", b"f"), f"s3://{bucket}/shared/f.txt")
    real_replace = os.replace

    def racing_replace(src: str | Path, dst: str | Path) -> None:
        if Path(src).is_dir():  # the other process renames its copy in just before us
            shutil.copytree(src, dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", racing_replace)
    cache = tmp_path / "cache"
    tree, was_cached = storage.fetch_tree(f"s3://{bucket}/shared", cache)
    assert was_cached
    assert (tree / "f.txt").read_bytes() == b"f"
    assert [p.name for p in tree.parent.iterdir()] == ["tree"]  # staging removed


def test_copy_tree_to_s3_and_to_a_local_directory(bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "export"
    files = {"metrics.json": b"{}", "plots/loss.png": b"\x89PNG", "model/weights.pt": b"w" * 99}
    for name, data in files.items():
        write(source / name, data)

    written = storage.copy_tree(source, f"s3://{bucket}/exports/run-1/")
    assert written == [f"s3://{bucket}/exports/run-1/{name}" for name in sorted(files)]
    listing = {key: (size, etag) for key, size, etag in storage.list_keys(f"s3://{bucket}/")}
    assert listing == {
        f"exports/run-1/{name}": (len(data), md5(data)) for name, data in files.items()
    }

    local = tmp_path / "copy"
    written = storage.copy_tree(source, str(local))
    assert written == [str(local / name) for name in sorted(files)]
    assert {n: (local / n).read_bytes() for n in files} == files


def test_read_bytes_and_remove(bucket: str, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/tmp/blob"
    storage.upload(write(tmp_path / "blob", b"\x00\x01binary"), uri)
    assert storage.read_bytes(uri) == b"\x00\x01binary"

    storage.remove(uri)
    with pytest.raises(AmpbenchError, match=f"^{re.escape(uri)}: no such object"):
        storage.head(uri)
    with pytest.raises(AmpbenchError, match=f"^{re.escape(uri)}: no such object"):
        storage.read_bytes(uri)

    local = write(tmp_path / "local.bin", b"here")
    assert storage.read_bytes(str(local)) == b"here"
    storage.remove(str(local))
    assert not local.exists()
    storage.remove(str(local))  # already gone: fine


# -- errors: one line naming the URI, never a credential ---------------------------------------


def assert_clean(error: AmpbenchError, uri: str, rgw: Rgw, *secrets: str) -> None:
    message = str(error)
    assert uri in message
    for secret in (rgw.access_key, rgw.secret_key, *secrets):
        assert secret not in message
    assert "\n" not in message


def test_missing_bucket(s3: Rgw, tmp_path: Path) -> None:
    uri = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/data/x.bin"
    with pytest.raises(AmpbenchError) as error:
        storage.read_bytes(uri)
    assert_clean(error.value, uri, s3)
    assert "the bucket does not exist" in str(error.value)

    with pytest.raises(AmpbenchError) as error:
        storage.upload(write(tmp_path / "x.bin", b"x"), uri)
    assert_clean(error.value, uri, s3)
    assert "NoSuchBucket" in str(error.value)

    with pytest.raises(AmpbenchError) as error:
        storage.fetch(uri, tmp_path / "cache")
    assert_clean(error.value, uri, s3)


def test_missing_key(bucket: str, s3: Rgw, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/no/such/key.bin"
    for call in (
        lambda: storage.head(uri),
        lambda: storage.read_bytes(uri),
        lambda: storage.fetch(uri, tmp_path / "cache"),
    ):
        with pytest.raises(AmpbenchError, match="no such object") as error:
            call()
        assert_clean(error.value, uri, s3)
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))


def test_wrong_secret_key(
    bucket: str, s3: Rgw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"s3://{bucket}/data/file.bin"
    s3.client().put_object(Bucket=bucket, Key="data/file.bin", Body=b"data")
    wrong = "W" + s3.secret_key[1:][::-1]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    storage.client.cache_clear()

    with pytest.raises(AmpbenchError, match="access denied") as error:
        storage.head(uri)
    assert_clean(error.value, uri, s3, wrong)

    with pytest.raises(AmpbenchError, match="SignatureDoesNotMatch") as error:
        storage.read_bytes(uri)
    assert_clean(error.value, uri, s3, wrong)

    with pytest.raises(AmpbenchError) as error:
        storage.upload(write(tmp_path / "f.bin", b"f"), uri)
    assert_clean(error.value, uri, s3, wrong)
    assert "SignatureDoesNotMatch" in str(error.value)


def test_unknown_access_key(bucket: str, s3: Rgw, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"s3://{bucket}/data/file.bin"
    unknown = "AMPBUNKNOWN" + s3.access_key[11:]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", unknown)
    storage.client.cache_clear()
    with pytest.raises(AmpbenchError, match="access key is not known") as error:
        storage.read_bytes(uri)
    assert_clean(error.value, uri, s3, unknown)


def test_unreachable_endpoint(s3: Rgw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services import closed_port

    with closed_port() as port:  # bound, not listening: refused for the whole test
        closed = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
        storage.client.cache_clear()
        uri = "s3://some-bucket/data/file.bin"
        for call in (
            lambda: storage.head(uri),
            lambda: storage.upload(write(tmp_path / "f.bin", b"f"), uri),
        ):
            with pytest.raises(AmpbenchError, match="cannot reach the S3 endpoint") as error:
                call()
            assert_clean(error.value, uri, s3)
            assert closed in str(error.value)


@pytest.mark.usefixtures("tiny_model")
def test_an_arm_reads_its_data_from_and_hands_its_outputs_back_to_s3(
    bucket: str, synthetic_dataset: Path, tmp_path: Path
) -> None:
    """train_hand_off, as a TrainJob's node runs it: the prepared data fetched from an s3://
    prefix, the results and weights copied to one."""
    from ampbench.results import RESULTS_FILE, read_arm_results
    from ampbench.train.config import TrainConfig
    from ampbench.train.launch import MODEL_FILE, HandOff, train_hand_off
    from ampbench.train.profile import TRACE_FILE

    storage.copy_tree(synthetic_dataset, f"s3://{bucket}/data")
    config = TrainConfig(
        Path("unused"), precision="fp32", model="small-cnn", epochs=1, batch_size=10, subset=40,
        device="cpu",
    )  # fmt: skip
    results = train_hand_off(HandOff(config, f"s3://{bucket}/data", f"s3://{bucket}/out", None))
    assert results is not None
    fetched = storage.fetch_tree(f"s3://{bucket}/out", tmp_path / "back")[0]
    handed_back = sorted([RESULTS_FILE, MODEL_FILE, TRACE_FILE])
    assert sorted(path.name for path in fetched.iterdir()) == handed_back
    assert read_arm_results(fetched / RESULTS_FILE).accuracy == results.accuracy


def test_read_bytes_if_any_tells_a_missing_object_from_a_failure(bucket: str) -> None:
    """No object is None (the compile cache's miss); a missing bucket is an error naming it."""
    assert storage.read_bytes_if_any(f"s3://{bucket}/compile-cache/none.tar.gz") is None
    with pytest.raises(AmpbenchError, match=r"^s3://no-such-bucket-x/k: the bucket does not exist"):
        storage.read_bytes_if_any("s3://no-such-bucket-x/k")


def test_the_compile_cache_round_trips_through_s3(bucket: str) -> None:
    from ampbench.train.compile_cache import CompileCache

    location = f"s3://{bucket}/compile-cache"
    with CompileCache(location, "step.tar.gz") as first:
        (first.directory / "fxgraph").mkdir()
        (first.directory / "fxgraph" / "entry").write_bytes(b"compiled")
        assert first.finish(store=True) == "miss"
    with CompileCache(location, "step.tar.gz") as second:
        assert (second.directory / "fxgraph" / "entry").read_bytes() == b"compiled"
        assert second.finish(store=True) == "hit"


def test_writing_puts_a_local_file_in_place_whole_or_not_at_all(tmp_path: Path) -> None:
    """Nothing under the name until the block ends, and no partial file left after a failure."""
    target = tmp_path / "shared" / "blob"
    with storage.writing(str(target)) as local:
        local.write_bytes(b"whole")
        assert not target.exists()
    assert target.read_bytes() == b"whole"
    with pytest.raises(RuntimeError), storage.writing(str(target)) as local:
        local.write_bytes(b"part")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"whole"
    assert sorted(p.name for p in target.parent.iterdir()) == ["blob"]


def test_writing_uploads_when_the_block_ends_and_not_when_it_fails(bucket: str) -> None:
    uri = f"s3://{bucket}/writing/blob"
    with pytest.raises(RuntimeError), storage.writing(uri) as local:
        local.write_bytes(b"part")
        raise RuntimeError("the writer failed")
    assert storage.read_bytes_if_any(uri) is None
    with storage.writing(uri) as local:
        local.write_bytes(b"whole")
    assert storage.read_bytes(uri) == b"whole"
