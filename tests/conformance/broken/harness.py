"""Run the suite against one mutant of the sample (or of the mock), in this process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ibal.testing.runner import RunResult, run_pytest

HERE = Path(__file__).resolve().parent
SUITE = HERE / "suite_broken.py"
MOCK_SUITE = HERE / "suite_broken_mock.py"


class MutantPlugin:
    """Gives the suite module the name of the mutant to apply."""

    def __init__(self, name: str) -> None:
        self.name = name

    @pytest.fixture
    def broken_mutant(self) -> str:
        return self.name


def run_mutant(
    name: str, *, first_failure: bool = True, extra: tuple[str, ...] = (), mock: bool = False
) -> RunResult:
    """The suite against mutant ``name`` (``""``: the sample as shipped).

    ``mock``: ``name`` is one of ``broken_mock.MOCK_MUTANTS`` (``""``: the mock as
    shipped), run against the Invalidate and MAD chapters only.
    """
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    suite = MOCK_SUITE if mock else SUITE
    args = [str(suite), "-q", "-p", "no:cacheprovider", "--no-header", "-p", "no:randomly"]
    if first_failure:
        args.append("-x")
    return run_pytest([*args, *extra], plugins=[MutantPlugin(name)])
