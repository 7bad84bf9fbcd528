"""An experiment matrix: models x batch sizes x precisions x seeds, one training run each.

The pipeline trains a flat list of runs (its `runs` parameter: one ParallelFor over it, since
neither KFP's local runner nor its Collected can gather from nested loops), and this module
is the one place that list is made (`ampbench run`, `ampbench submit`, the compiled default)
and checked (the prepare step, before any training task starts). Each (model, batch size)
group gets the baseline precision whether or not it was asked for: every arm is compared with
its own group's baseline. Free of torch, so that the command line stays quick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ampbench.errors import AmpbenchError
from ampbench.train import AMP_PRECISION, BASELINE_PRECISION, PRECISIONS
from ampbench.train.config import TrainConfig, check_pipeline_settings


@dataclass(frozen=True)
class MatrixRun:
    """One training task of the matrix: an arm (model, batch size, precision) and a seed."""

    model: str
    batch_size: int
    precision: str
    seed: int


def group_label(model: str, batch_size: int) -> str:
    """How reports and MLflow tags name a (model, batch size) group."""
    return f"{model}, batch {batch_size or 'automatic'}"


def run_name(model: str, batch_size: int, precision: str, seed: int) -> str:
    """How MLflow runs, checkpoint folders and saved models name one run of the matrix."""
    return f"{model}-b{batch_size or 'auto'}-{precision}-seed{seed}"


def matrix_runs(
    models: Sequence[str],
    batch_sizes: Sequence[int],
    precisions: Sequence[str],
    seeds: Sequence[int],
    baseline: str = BASELINE_PRECISION,
) -> list[dict[str, str | int]]:
    """The runs of the matrix, as the pipeline's `runs` parameter takes them; baseline arms
    first in each group (on one machine they then run first, as the comparison reads them)."""
    arms = [baseline, *(p for p in dict.fromkeys(precisions) if p != baseline)]
    runs = [
        MatrixRun(model, batch_size, precision, seed)
        for model in dict.fromkeys(models)
        for batch_size in dict.fromkeys(batch_sizes)
        for precision in arms
        for seed in dict.fromkeys(seeds)
    ]
    if len(arms) < 2:
        raise AmpbenchError(
            f"--precisions: only the baseline '{baseline}' is listed; nothing to compare it with"
        )
    return [asdict(run) for run in runs]


def runs_of_lists(
    models: Sequence[str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    precisions: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    baseline: str = BASELINE_PRECISION,
) -> list[dict[str, str | int]]:
    """matrix_runs of the lists `run` and `submit` were given, each list not given the default
    experiment's: TrainConfig's model, batch size and seed, and the AMP arm."""
    return matrix_runs(
        models or [TrainConfig.model],
        batch_sizes or [TrainConfig.batch_size],
        precisions or [AMP_PRECISION],
        seeds or [TrainConfig.seed],
        baseline,
    )


# What `make run` and the compiled pipeline train by default: the published pair.
DEFAULT_RUNS = runs_of_lists()


def parse_runs(runs: object) -> list[MatrixRun]:
    """The pipeline's `runs` parameter, checked: a list of {model, batch_size, precision, seed}
    with no run twice (any problem is one line naming the parameter)."""
    if not isinstance(runs, list) or not runs:
        raise AmpbenchError("runs: must be a non-empty list of training runs")
    parsed = []
    fields = set(MatrixRun.__dataclass_fields__)
    for index, run in enumerate(runs):
        where = f"runs[{index}]"
        if not isinstance(run, dict) or set(run) != fields:
            raise AmpbenchError(f"{where}: must have exactly the keys {', '.join(sorted(fields))}")
        model, batch_size, precision, seed = (run[key] for key in MatrixRun.__dataclass_fields__)
        if not isinstance(model, str) or not model:
            raise AmpbenchError(f"{where}: model must be a non-empty string")
        # KFP hands JSON numbers over as floats: 128.0 is 128, 128.5 is not a batch size.
        for name, value in (("batch_size", batch_size), ("seed", seed)):
            whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            if isinstance(value, bool) or not whole:
                raise AmpbenchError(f"{where}: {name} must be an integer, not {value!r}")
        if int(batch_size) < 0:
            raise AmpbenchError(
                f"{where}: batch_size must be at least 1 (or 0: automatic), not {batch_size}"
            )
        if precision not in PRECISIONS:
            raise AmpbenchError(
                f"{where}: precision '{precision}' is not one of {', '.join(PRECISIONS)}"
            )
        parsed.append(MatrixRun(model, int(batch_size), precision, int(seed)))
    if len(set(parsed)) < len(parsed):
        twice = next(run for run in parsed if parsed.count(run) > 1)
        raise AmpbenchError(f"runs: {twice} is listed twice")
    return parsed


def check_runs(runs: object, baseline: str) -> list[MatrixRun]:
    """parse_runs, and a baseline run and another arm in every (model, batch size) group: the
    comparison at the end needs both, and must not find out after the training."""
    parsed = parse_runs(runs)
    groups: dict[tuple[str, int], set[str]] = {}
    for run in parsed:
        groups.setdefault((run.model, run.batch_size), set()).add(run.precision)
    for (model, batch_size), precisions in groups.items():
        if baseline not in precisions:
            raise AmpbenchError(
                f"runs: model {model} at batch size {batch_size} has no {baseline} run "
                "(its baseline)"
            )
    if all(precisions == {baseline} for precisions in groups.values()):
        raise AmpbenchError(f"runs: only baseline ({baseline}) runs; nothing to compare")
    return parsed


def check_matrix(
    runs: object, baseline: str, *, subset: int = 0, processes: int = 1, **training: Any
) -> list[MatrixRun]:
    """check_runs, and the training settings (TrainConfig's fields) of every (model, batch
    size) group, as preflight checks them."""
    parsed = check_runs(runs, baseline)
    for model, batch_size in sorted({(run.model, run.batch_size) for run in parsed}):
        check_pipeline_settings(
            batch_size=batch_size, model=model, subset=subset, processes=processes, **training
        )
    return parsed
