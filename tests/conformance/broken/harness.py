"""Run the suite against one mutant of the sample (or of the mock), in this process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ibal.testing.plugin import chapter_of
from ibal.testing.runner import RunResult, run_pytest

HERE = Path(__file__).resolve().parent
SUITE = HERE / "suite_broken.py"
MOCK_SUITE = HERE / "suite_broken_mock.py"

SUITE_CHAPTERS = {
    "QP": ("QP create & state machine", "QP state"),
    "contract": ("provider contract (direct CI)",),
    "destroy & cleanup": ("destroy ordering & cascade",),
    "handles": ("handle validation",),
    "memory regions": ("MR",),
    "post": ("posting",),
}
"""The suite's chapter names for a mutant's chapter label where the two differ."""


class MutantPlugin:
    """Gives the suite module the name of the mutant to apply."""

    def __init__(self, name: str) -> None:
        self.name = name

    @pytest.fixture
    def broken_mutant(self) -> str:
        return self.name

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """The chapter of the rule the mutant breaks runs first, the rest after it in suite
        order: the same checks run, but ``-x`` stops at the kill seconds sooner."""
        from broken_sample import MUTANTS

        mutant = MUTANTS.get(self.name)
        if mutant is not None:
            first = SUITE_CHAPTERS.get(mutant.chapter, (mutant.chapter,))
            items.sort(key=lambda item: chapter_of(item) not in first)


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
