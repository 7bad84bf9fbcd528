"""mkdocs hooks: the pages made from the code, so that they cannot drift from it. The CLI
reference is each command's own argparse help; the record reference is the results' and the
comparison's dataclasses, field by field."""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from typing import Any

from mkdocs.structure.files import File, Files

GENERATED = {"cli.md": "cli_reference", "records.md": "records_reference"}


def on_files(files: Files, config: Any) -> Files:
    for name, function in GENERATED.items():
        files.append(File.generated(config, name, content=globals()[function]()))
    return files


def cli_reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps its help to the terminal's width
    from ampbench.cli import COMMANDS, build_parser

    lines = [
        "# Command-line reference",
        "",
        "Each command's `--help`, as `ampbench` prints it.",
        "",
    ]
    for name, command in COMMANDS.items():
        parser = build_parser(with_options=[name])
        (commands,) = (
            action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
        )
        lines += [f"## `ampbench {name}`", "", command.help + ".", "", "```text"]
        lines += [commands.choices[name].format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return (
        text.replace("typing.", "")
        .replace("ampbench.results.", "")
        .replace("ampbench.comparison.", "")
    )


def _records(root: type) -> list[type]:
    """`root` and every dataclass its fields hold, in the order they are met."""
    found: list[type] = []

    def visit(cls: type) -> None:
        if cls in found:
            return
        found.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for inner in (hint, *typing.get_args(hint), *_nested_args(hint)):
                if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                    visit(inner)

    visit(root)
    return found


def _nested_args(hint: Any) -> list[Any]:
    return [inner for arg in typing.get_args(hint) for inner in typing.get_args(arg)]


def records_reference() -> str:
    from ampbench.comparison import COMPARISON_SCHEMA_VERSION, Comparison
    from ampbench.results import RESULTS_SCHEMA_VERSION, ArmResults

    lines = [
        "# Records",
        "",
        "The JSON records ampbench writes, field by field, read from their definitions "
        "(`ampbench/results.py`, `ampbench/comparison.py`). A field with a default may be "
        "absent from a file; any other is required, and a field not listed is refused.",
        "",
    ]
    for title, root, version in (
        ("An arm's results (`results.json` of a train task)", ArmResults, RESULTS_SCHEMA_VERSION),
        ("A comparison (`results.json` of a run)", Comparison, COMPARISON_SCHEMA_VERSION),
    ):
        lines += [f"## {title}: schema version {version}", ""]
        for cls in _records(root):
            lines += [f"### `{cls.__name__}`", ""]
            doc = (cls.__doc__ or "").strip()
            if doc and not doc.startswith(f"{cls.__name__}("):
                lines += [" ".join(doc.split()), ""]
            lines += ["| field | type | default |", "|---|---|---|"]
            hints = typing.get_type_hints(cls)
            for field in dataclasses.fields(cls):
                if field.default is not dataclasses.MISSING:
                    default = f"`{field.default!r}`"
                elif field.default_factory is not dataclasses.MISSING:
                    default = f"`{field.default_factory()!r}`"
                else:
                    default = "required"
                lines.append(f"| `{field.name}` | `{_type_name(hints[field.name])}` | {default} |")
            lines.append("")
    return "\n".join(lines)
