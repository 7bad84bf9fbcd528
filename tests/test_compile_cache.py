"""A compiled step shared between processes through an archive of Inductor's cache
(ampbench/train/compile_cache.py), and the engine and train task that use it."""

from __future__ import annotations

import dataclasses
import logging
import os
import tarfile
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
    a directory of its own, is unpacked from it, and Inductor serves the graph from there."""
    from torch._dynamo.utils import counters

    location = str(tmp_path / "shared")
    before = os.environ.get(INDUCTOR_CACHE_ENV)
    outcomes = []
    for _ in range(2):
        counters.clear()
        with CompileCache(location, "step.tar.gz") as cache:
            assert os.environ[INDUCTOR_CACHE_ENV] == str(cache.directory)
            assert os.environ[TRITON_CACHE_ENV] == str(cache.directory / "triton")
            compile_and_run()
            cache.store()
        outcomes.append((cache.outcome, dict(counters["inductor"])))
    assert outcomes[0] == ("miss", {"fxgraph_cache_miss": 1})
    assert outcomes[1] == ("hit", {"fxgraph_cache_hit": 1})
    assert os.environ.get(INDUCTOR_CACHE_ENV) == before  # put back
    assert [p.name for p in (tmp_path / "shared").iterdir()] == ["step.tar.gz"]


def test_an_unreadable_archive_is_a_warning_and_a_miss_and_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "step.tar.gz").write_bytes(b"not an archive")
    with caplog.at_level(logging.WARNING), CompileCache(str(tmp_path), "step.tar.gz") as cache:
        (cache.directory / "entry").write_text("compiled")
        cache.store()
    assert cache.outcome == "miss"
    assert f"compile cache: {tmp_path / 'step.tar.gz'} is unreadable" in caplog.text
    with CompileCache(str(tmp_path), "step.tar.gz") as again:
        assert (again.directory / "entry").read_text() == "compiled"
    assert again.outcome == "hit"
    assert not list(tmp_path.glob("*.partial-*"))


def test_an_archive_cannot_write_outside_its_directory(tmp_path: Path) -> None:
    """Unpacked with tarfile's data filter: a member aimed outside is refused, not written."""
    hostile = tmp_path / "step.tar.gz"
    with tarfile.open(hostile, "w:gz") as archive:
        (tmp_path / "payload").write_text("x")
        archive.add(tmp_path / "payload", arcname="../../escaped")
    with CompileCache(str(tmp_path), "step.tar.gz") as cache:
        pass
    assert cache.outcome == "miss"
    assert not (cache.directory.parent.parent / "escaped").exists()


def test_the_archive_names_the_arm_and_digests_the_rest_of_the_graph() -> None:
    graph = {"torch": "2.14.1", "device": "NVIDIA H200", "processes": 1}
    name = archive_name("pkg.mod:factory", 128, "bf16", graph)
    assert name.startswith("pkg.mod_factory-b128-bf16-") and name.endswith(".tar.gz")
    assert archive_name("pkg.mod:factory", 128, "bf16", graph | {"processes": 2}) != name


@pytest.mark.usefixtures("tiny_model")
def test_the_engine_compiles_once_per_graph_and_records_where_it_came_from(
    synthetic_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one arm: the first a miss that leaves the archive (rank 0), the second a
    hit; both say so in their results, and the location is no hyperparameter (arms sharing a
    cache or not compare alike)."""
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
    uncached, _ = train(dataclasses.replace(config, compile_cache=None))
    assert uncached.timing.compile_cache is None


def test_a_compile_cache_without_compile_is_refused() -> None:
    config = TrainConfig(Path("d"), compile_cache="/tmp/cache")
    with pytest.raises(AmpbenchError, match=r"^--compile-cache: needs --compile"):
        config.validate()
