"""Print, for every mutant, the checks that catch it (a Markdown table).

``python tests/conformance/broken/report.py [NAME ...]`` runs the whole suite
against each mutant of the sample, and the Invalidate and MAD chapters against
each mutant of the mock (not stopping at the first failure), and prints the
table ``docs/conformance.md`` records, then the kill rate.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broken_mock import MOCK_MUTANTS
from broken_sample import MUTANTS
from harness import run_mutant


def main(names: list[str]) -> int:
    names = names or sorted(MUTANTS) + sorted(MOCK_MUTANTS)
    killed = 0
    start = time.monotonic()
    print("| mutant | rule it breaks | checks that fail |")
    print("|---|---|---|")
    for name in names:
        mock = name in MOCK_MUTANTS
        with contextlib.redirect_stdout(io.StringIO()):
            result = run_mutant(name, first_failure=False, mock=mock)
        failing = sorted({c.nodeid.split("::")[-1].split("[")[0] for c in result.problems()})
        killed += bool(failing)
        shown = ", ".join(f"`{f}`" for f in failing[:4]) + (
            f" (+{len(failing) - 4})" if len(failing) > 4 else ""
        )
        rule = (MOCK_MUTANTS if mock else MUTANTS)[name].rule
        label = f"`{name}` (mock)" if mock else f"`{name}`"
        print(f"| {label} | {rule} | {shown or '**survives**'} |", flush=True)
    took = time.monotonic() - start
    print(f"\nkilled {killed} of {len(names)} in {took:.0f} s", file=sys.stderr)
    return 0 if killed == len(names) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
