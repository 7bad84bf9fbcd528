"""Options that more than one command takes: settings (ampbench/settings.py), the experiment's
leaves, the matrix's lists and the comparison's."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from ampbench.settings import Setting


def add_setting_options(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """An option per setting (ampbench/settings.py): its flag, default, type and description."""
    for each in settings:
        options: dict[str, Any] = {"dest": each.name, "default": each.default}
        if each.type is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = each.parse
            options["metavar"] = each.flag.upper().replace("-", "_")
        parser.add_argument("--" + each.flag, help=each.description.replace("%", "%%"), **options)


def add_experiment_options(
    parser: argparse.ArgumentParser, sections: Iterable[str] = (), names: Iterable[str] = ()
) -> None:
    """An option per leaf of the experiment (ampbench/experiment.py) in `sections` or `names`."""
    from ampbench.experiment import parameters

    sections, names = set(sections), set(names)
    add_setting_options(
        parser, [leaf for leaf in parameters() if leaf.section in sections or leaf.name in names]
    )


def add_matrix_options(
    parser: argparse.ArgumentParser, description: str
) -> argparse._ArgumentGroup:
    """The lists `run` and `submit` make their matrix from (matrix.runs_of_lists), less
    --seeds, which each command places itself. The group, to add to."""
    from ampbench.argtypes import batch_size_list, model_list, precision_list
    from ampbench.train import PRECISIONS

    matrix = parser.add_argument_group("experiment matrix", description)
    matrix.add_argument(
        "--precisions",
        type=precision_list,
        metavar="LIST",
        help="precisions to compare with the baseline, e.g. tf32,fp16,bf16 (of "
        f"{', '.join(PRECISIONS)})",
    )
    matrix.add_argument("--batch-sizes", type=batch_size_list, metavar="LIST", help="e.g. 128,512")
    matrix.add_argument("--models", type=model_list, metavar="LIST", help="e.g. resnet18,vit-s")
    return matrix


def add_comparison_options(parser: argparse.ArgumentParser) -> None:
    """The comparison's options and the baseline's precision (`run` and `compare`)."""
    add_experiment_options(parser, sections=("comparison",), names=("baseline_precision",))
