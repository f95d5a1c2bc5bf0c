"""The mutation test: the suite must catch every deliberately broken sample provider.

Each mutant of ``broken_sample.MUTANTS`` breaks one rule; the suite runs
in-process against it (stopping at the first failure) and must fail.  The
unbroken sample must pass the very same run, so a kill is the mutant's doing.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from broken_sample import MUTANTS, VARIANTS
from harness import run_mutant


def _run(name: str) -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_mutant(name)
    assert result.checks, f"no check ran (pytest exit status {result.exit_code})"
    return [c.nodeid.split("::")[-1] for c in result.problems()]


@pytest.mark.parametrize("variant", ["", *sorted(VARIANTS)])
def test_conformant_sample_passes(variant: str) -> None:
    assert _run(variant) == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_suite_catches_mutant(name: str) -> None:
    caught = _run(name)
    assert caught, f"mutant {name!r} ({MUTANTS[name].rule}) passed the whole suite"
