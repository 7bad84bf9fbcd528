"""Mutation score per module from `mutmut results --all true`, less the equivalent mutants
docs/development.md names (in backquotes, with the reason beside them); fails below the goal."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

GOAL = 0.85
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
EQUIVALENTS = Path(__file__).resolve().parents[1] / "docs" / "development.md"


def equivalent_mutants(page: Path) -> set[str]:
    return set(re.findall(r"`(ampbench\.[^`\s]+__mutmut_\d+)`", page.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, help="output of `mutmut results --all true`")
    parser.add_argument("modules", nargs="+", help="the mutated files, as staged")
    args = parser.parse_args()
    lines = args.results.read_text().splitlines()
    statuses = dict(line.strip().rsplit(": ", 1) for line in lines if ": " in line)
    equivalent = equivalent_mutants(EQUIVALENTS)
    counts: dict[str, Counter[str]] = {}
    for name, status in statuses.items():
        module = re.split(r"\.x[_ǁ]", name, maxsplit=1)[0]
        kind = "killed" if status in KILLED else "equivalent" if name in equivalent else "survived"
        counts.setdefault(module, Counter())[kind] += 1
    failed = False
    print(f"{'module':48} {'mutants':>8} {'killed':>7} {'equiv.':>7} {'survived':>9} {'score':>7}")
    for path in args.modules:
        module = path.removesuffix(".py").replace("/", ".")
        c = counts.get(module, Counter())
        total = sum(c.values())
        scored = total - c["equivalent"]
        score = c["killed"] / scored if scored else 0.0
        failed |= score < GOAL
        print(
            f"{module:48} {total:8} {c['killed']:7} {c['equivalent']:7} {c['survived']:9}"
            f" {score:7.1%}"
        )
    if failed:
        print(f"below the goal of {GOAL:.0%} killed in some module", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
