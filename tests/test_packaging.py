"""The wheel's package list names every package of the tree, where it installs: a package left
out is missing from the image and the GPU bundle, while an editable install hides the gap."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):
    pytest.skip("tomllib is Python 3.11's", allow_module_level=True)
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_of_the_tree_is_listed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    # The mapped folders (ampbench/, components/, pipelines/) are side by side, not nested.
    found = {
        ".".join([package, *init.parent.relative_to(ROOT / folder).parts])
        for package, folder in setuptools["package-dir"].items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert sorted(setuptools["packages"]) == sorted(found)
