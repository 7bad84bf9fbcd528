"""pytest plugin for `make mutation`: a mutant's tests run fastest first (durations from mutmut's
stats), so that a killed mutant costs its fastest failing test rather than whichever came first
(mutmut passes them in set order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

STATS = Path("mutmut-stats.json")  # in the mutants/ directory, where mutmut runs the tests


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not STATS.is_file():  # the stats run itself
        return
    durations: dict[str, float] = json.loads(STATS.read_text())["duration_by_test"]
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
