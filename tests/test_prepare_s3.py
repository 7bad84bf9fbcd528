"""Data sources in S3 (a real Ceph RADOS Gateway): files, archives and prefixes, the ETag
cache, and errors that name the URI and never a credential."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from datagen import make_cifar_python_tarball, make_image_folder, make_tar

from ampbench import storage
from ampbench.data import SourceOptions, prepare_dataset
from ampbench.dataset_format import read_split
from ampbench.errors import AmpbenchError

if TYPE_CHECKING:
    from services import Rgw

pytest_plugins = ["services"]


@pytest.fixture()
def s3_env(rgw: Rgw, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The RGW's endpoint and keys in the standard variables; a fresh bucket's name."""
    for name, value in rgw.env().items():
        monkeypatch.setenv(name, value)
    storage.client.cache_clear()
    yield rgw.make_bucket(f"data-{uuid.uuid4().hex[:10]}")
    storage.client.cache_clear()


def put(rgw: Rgw, bucket: str, key: str, path: Path) -> str:
    rgw.client().upload_file(str(path), bucket, key)
    return f"s3://{bucket}/{key}"


def test_archive_in_s3_is_fetched_once_then_cached(
    rgw: Rgw, s3_env: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 3, "test": 2})
    uri = put(
        rgw, s3_env, "sets/tree.tar.gz", make_tar(tmp_path / "tree.tar.gz", tmp_path / "tree")
    )
    options = SourceOptions(cache_dir=tmp_path / "cache")
    first = prepare_dataset(uri, tmp_path / "one", options=options, use_cache=False)
    assert first["counts"] == {"train": 6, "test": 4}
    assert first["source"]["spec"] == uri
    downloads = list((tmp_path / "cache" / "s3").rglob("tree.tar.gz"))
    assert len(downloads) == 1
    stamp = downloads[0].stat().st_mtime_ns
    second = prepare_dataset(uri, tmp_path / "two", options=options, use_cache=False)
    assert second["source"]["sha256"] == first["source"]["sha256"]
    assert downloads[0].stat().st_mtime_ns == stamp  # served from the ETag-keyed cache
    # A new object under the same key has a new ETag: fetched again.
    make_image_folder(tmp_path / "tree", ["a", "b"], {"train": 4})
    put(rgw, s3_env, "sets/tree.tar.gz", make_tar(tmp_path / "tree2.tar.gz", tmp_path / "tree"))
    third = prepare_dataset(uri, tmp_path / "three", options=options, use_cache=False)
    assert third["counts"]["train"] == 8
    assert len(list((tmp_path / "cache" / "s3").rglob("tree.tar.gz"))) == 2


def test_cifar_tarball_in_s3(rgw: Rgw, s3_env: str, tmp_path: Path) -> None:
    make_cifar_python_tarball(tmp_path / "cifar-10-python.tar.gz")
    uri = put(rgw, s3_env, "cifar-10-python.tar.gz", tmp_path / "cifar-10-python.tar.gz")
    metadata = prepare_dataset(
        uri, tmp_path / "out", options=SourceOptions(cache_dir=tmp_path / "c")
    )
    assert metadata["source"]["kind"] == "cifar10-python"
    assert metadata["counts"] == {"train": 100, "test": 20}


def test_directory_tree_under_a_prefix(rgw: Rgw, s3_env: str, tmp_path: Path) -> None:
    make_image_folder(tmp_path / "tree", ["cat", "dog"], {"train": 2, "test": 1})
    for file in (tmp_path / "tree").rglob("*.png"):
        put(rgw, s3_env, f"trees/pets/{file.relative_to(tmp_path / 'tree').as_posix()}", file)
    uri = f"s3://{s3_env}/trees/pets/"
    metadata = prepare_dataset(
        uri, tmp_path / "out", options=SourceOptions(cache_dir=tmp_path / "c")
    )
    assert metadata["classes"] == ["cat", "dog"]
    assert read_split(tmp_path / "out", "train").labels.tolist() == [0, 0, 1, 1]


def failing(tmp_path: Path, uri: str, pattern: str, secret: str) -> None:
    with pytest.raises(AmpbenchError, match=pattern) as raised:
        prepare_dataset(uri, tmp_path / "out", options=SourceOptions(cache_dir=tmp_path / "c"))
    message = str(raised.value)
    assert uri in message and secret not in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_missing_object_bucket_and_bad_keys(
    rgw: Rgw, s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing(tmp_path, f"s3://{s3_env}/nothing-here.tar.gz", "no such object", rgw.secret_key)
    failing(
        tmp_path, "s3://no-such-bucket-4242/data.tar.gz", "no such object|bucket", rgw.secret_key
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value-123")
    storage.client.cache_clear()
    failing(tmp_path, f"s3://{s3_env}/data.tar.gz", "HTTP 403", "wrong-secret-value-123")


def test_unreachable_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret-987")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    storage.client.cache_clear()
    try:
        failing(
            tmp_path,
            "s3://bucket/data.tar.gz",
            "cannot reach the S3 endpoint",
            "not-a-real-secret-987",
        )
    finally:
        storage.client.cache_clear()


def test_checkpoints_in_s3_survive_and_resume(
    rgw: Rgw, s3_env: str, synthetic_dataset: Path, tmp_path: Path
) -> None:
    from ampbench.train.checkpoint import names
    from ampbench.train.config import TrainConfig
    from ampbench.train.loop import train

    directory = f"s3://{s3_env}/checkpoints/run-1"
    config = TrainConfig(
        dataset_dir=synthetic_dataset, precision="fp32", model="small-cnn", epochs=1,
        batch_size=50, subset=300, device="cpu", deterministic=True,
        checkpoint_dir=directory, checkpoint_every=2, keep_checkpoints=2,
    )  # fmt: skip
    first, _ = train(config)
    assert names(directory) == ["ckpt-000000004.pt", "ckpt-000000006.pt"]  # the last 2 kept
    # A retried task (same directory, --resume) finds the run finished and ends as it did.
    again, _ = train(TrainConfig(**{**config.__dict__, "epochs": 1, "resume": True}))
    assert again.resumed_from == f"{directory}/ckpt-000000006.pt"
    assert again.accuracy == first.accuracy
