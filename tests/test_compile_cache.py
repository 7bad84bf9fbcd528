"""A compiled step shared between processes through an archive of Inductor's cache
(ampbench/train/compile_cache.py), and the engine and train task that use it."""

from __future__ import annotations

import dataclasses
import logging
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
import torch

from ampbench.errors import AmpbenchError
from ampbench.train.compile_cache import (
    INDUCTOR_CACHE_ENV,
    TRITON_CACHE_ENV,
    CompileCache,
    archive_name,
)
from ampbench.train.config import TrainConfig
from ampbench.train.loop import train


def compile_and_run() -> None:
    """A small function compiled by Inductor in this process, from scratch."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: (x * 2).sin().sum())
    compiled(torch.randn(64))


def test_a_graph_compiled_once_is_unpacked_and_served_by_inductor_in_the_next_cache(
    tmp_path: Path,
) -> None:
    """The first cache is empty (a miss) and its directory becomes the archive; the next,
    a directory of its own, is unpacked from it, and Inductor serves the graph from there
    (a hit: nothing new written). An archive without this graph is a miss, then refreshed."""
    from torch._dynamo.utils import counters

    location = tmp_path / "shared"
    before = os.environ.get(INDUCTOR_CACHE_ENV)
    outcomes = []
    for _ in range(2):
        counters.clear()
        with CompileCache(str(location), "step.tar.gz") as cache:
            assert os.environ[INDUCTOR_CACHE_ENV] == str(cache.directory)
            assert os.environ[TRITON_CACHE_ENV] == str(cache.directory / "triton")
            compile_and_run()
            outcome = cache.finish(store=True)
        outcomes.append((outcome, dict(counters["inductor"])))
    assert outcomes[0] == ("miss", {"fxgraph_cache_miss": 1})
    assert outcomes[1] == ("hit", {"fxgraph_cache_hit": 1})
    assert os.environ.get(INDUCTOR_CACHE_ENV) == before  # put back
    assert [p.name for p in location.iterdir()] == ["step.tar.gz"]

    with tarfile.open(location / "other.tar.gz", "w:gz") as archive:
        (tmp_path / "unrelated").write_text("another graph")
        archive.add(tmp_path / "unrelated", arcname="unrelated")
    with CompileCache(str(location), "other.tar.gz") as stale:
        compile_and_run()
        assert stale.fetched and stale.finish(store=True) == "miss"
    with tarfile.open(location / "other.tar.gz") as refreshed:
        names = refreshed.getnames()
    assert "./unrelated" in names and any(name.startswith("./fxgraph/") for name in names)


@pytest.mark.parametrize("damage", ["not gzip", "a flipped byte", "truncated"])
def test_an_unreadable_archive_is_a_warning_and_a_miss_and_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """However the archive is damaged (gzip's CRC catches what tarfile would not read), the
    arm compiles: a warning and a miss, and the archive is written anew."""
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as archive:
        (tmp_path / "entry").write_bytes(os.urandom(4096))
        archive.add(tmp_path / "entry", arcname="entry")
    data = bytearray(good.read_bytes())
    if damage == "not gzip":
        data = bytearray(b"not an archive")
    elif damage == "a flipped byte":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) - 8]  # the CRC and size trailer
    (tmp_path / "step.tar.gz").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING), CompileCache(str(tmp_path), "step.tar.gz") as cache:
        (cache.directory / "compiled").write_text("compiled")
        outcome = cache.finish(store=True)
    assert outcome == "miss" and not cache.fetched
    assert f"compile cache: {tmp_path / 'step.tar.gz'} is unreadable" in caplog.text
    with CompileCache(str(tmp_path), "step.tar.gz") as again:
        assert (again.directory / "compiled").read_text() == "compiled"
        assert again.finish(store=True) == "hit"
    assert not list(tmp_path.glob(".partial-*"))


def test_an_archive_cannot_write_outside_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpacked with tarfile's data filter: a member aimed outside is refused, not written
    (the cache directory made two levels below tmp_path, where an escape would land)."""
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(nested))
    with tarfile.open(tmp_path / "step.tar.gz", "w:gz") as archive:
        (tmp_path / "payload").write_text("x")
        archive.add(tmp_path / "payload", arcname="../../escaped")
    with CompileCache(str(tmp_path), "step.tar.gz") as cache:
        assert cache.directory.parent == nested
    assert not cache.fetched
    assert not (tmp_path / "a" / "escaped").exists()


def test_the_archive_names_the_arm_and_digests_the_rest_of_the_graph() -> None:
    graph = {"torch": "2.14.1", "device": "NVIDIA H200", "processes": 1}
    name = archive_name("pkg.mod:factory", 128, "bf16", graph)
    assert name.startswith("pkg.mod_factory-b128-bf16-") and name.endswith(".tar.gz")
    assert archive_name("pkg.mod:factory", 128, "bf16", graph | {"processes": 2}) != name


@pytest.mark.usefixtures("tiny_model")
def test_the_engine_compiles_once_per_graph_and_records_where_it_came_from(
    synthetic_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's wiring (AOT autograd compiles, so the archive holds no Inductor code):
    the first run a miss that leaves the archive (rank 0), the second a hit; both say so in
    their results, 'off' is none, and the location is no hyperparameter."""
    compile_function = torch.compile  # AOT autograd: the engine's wiring, without Inductor
    monkeypatch.setattr(
        torch, "compile", lambda model, **kw: compile_function(model, backend="aot_eager", **kw)
    )
    config = TrainConfig(
        synthetic_dataset, precision="fp32", model="small-cnn", epochs=1, batch_size=50,
        subset=100, device="cpu", compile=True, compile_cache=str(tmp_path / "cache"),
    )  # fmt: skip
    first, _ = train(config)
    second, _ = train(config)
    assert (first.timing.compile_cache, second.timing.compile_cache) == ("miss", "hit")
    (archive,) = (tmp_path / "cache").iterdir()
    assert archive.name.startswith("small-cnn-b50-fp32-")
    assert "compile_cache" not in first.hyperparameters
    for off in (None, "off"):
        uncached, _ = train(dataclasses.replace(config, compile_cache=off))
        assert uncached.timing.compile_cache is None


def test_a_compile_cache_without_compile_is_refused() -> None:
    config = TrainConfig(Path("d"), compile_cache="/tmp/cache")
    with pytest.raises(AmpbenchError, match=r"^--compile-cache: needs --compile"):
        config.validate()
    dataclasses.replace(config, compile_cache="off").validate()
