"""The mutation test: the suite must catch every deliberately broken provider.

Each mutant of ``broken_sample.MUTANTS`` breaks one rule of the sample
provider; the suite runs in-process against it (stopping at the first failure)
and must fail.  The unbroken sample must pass the very same run, so a kill is
the mutant's doing.  ``broken_mock.MOCK_MUTANTS`` do the same to the mock for
the chapters the sample does not implement (Invalidate, MADs).
"""

from __future__ import annotations

import contextlib
import io

import pytest
from broken_mock import MOCK_MUTANTS
from broken_sample import DEVIATING, MUTANTS, VARIANTS
from harness import run_mutant

from ibal.testing.runner import RunResult


def _result(name: str, first_failure: bool = True, mock: bool = False) -> RunResult:
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_mutant(name, first_failure=first_failure, mock=mock)
    assert result.checks, f"no check ran (pytest exit status {result.exit_code})"
    return result


def _run(name: str, mock: bool = False) -> list[str]:
    return [c.nodeid.split("::")[-1] for c in _result(name, mock=mock).problems()]


@pytest.mark.parametrize("variant", ["", *sorted(VARIANTS)])
def test_conformant_sample_passes(variant: str) -> None:
    assert _run(variant) == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_suite_catches_mutant(name: str) -> None:
    caught = _run(name)
    assert caught, f"mutant {name!r} ({MUTANTS[name].rule}) passed the whole suite"


def test_mock_passes_the_chapters_its_mutants_target() -> None:
    result = _result("", mock=True)
    assert result.problems() == []
    skipped = {c.nodeid.split("::")[-1] for c in result.checks if c.outcome == "skipped"}
    # Only the check for a CA *without* the invalidate opcodes may skip on the mock.
    assert skipped <= {"test_unlisted_opcodes_refused_unsupported"}, skipped


@pytest.mark.parametrize("name", sorted(MOCK_MUTANTS))
def test_suite_catches_mock_mutant(name: str) -> None:
    caught = _run(name, mock=True)
    assert caught, f"mock mutant {name!r} ({MOCK_MUTANTS[name].rule}) passed both chapters"


@pytest.mark.parametrize("name", sorted(DEVIATING))
def test_declared_deviation_is_reported_not_hidden(name: str) -> None:
    result = _result(name, first_failure=False)
    assert result.problems() == []
    reported = result.deviations()
    assert reported, "a declared deviation passed or skipped instead of being reported"
    assert all("deviation precise_local_errors: variant" in c.message for c in reported)
    assert "xfailed" in result.summary_line()
