"""Run the conformance suite in-process and collect per-check and per-chapter results.

``run_conformance("mock", {"cas": 2})`` runs ``pytest --ibal-provider mock``
inside this process with a small collector plugin and returns a
:class:`RunResult`; a :class:`Reporter` sees each check as it finishes (the
``ibal conformance`` command draws its progress bar from it).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import pytest

from ibal.testing.plugin import chapter_of

Outcome = Literal["passed", "failed", "skipped", "xfailed", "error"]
"""``xfailed``: a check that failed on a rule the CA declares it breaks (a deviation)."""

NO_CHAPTER = "other"


@dataclass
class ChapterResult:
    """Totals of one chapter."""

    name: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    xfailed: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped + self.errors + self.xfailed

    def add(self, outcome: Outcome) -> None:
        if outcome == "passed":
            self.passed += 1
        elif outcome == "failed":
            self.failed += 1
        elif outcome == "skipped":
            self.skipped += 1
        elif outcome == "xfailed":
            self.xfailed += 1
        else:
            self.errors += 1


@dataclass
class CheckResult:
    """One check: its node id, chapter, outcome and (for failures and skips) why."""

    nodeid: str
    chapter: str
    outcome: Outcome
    message: str = ""


@dataclass
class RunResult:
    """What a run produced: totals, per-chapter totals (in suite order) and every check."""

    exit_code: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    xfailed: int = 0
    duration: float = 0.0
    chapters: dict[str, ChapterResult] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0 and self.exit_code in (0, 5)

    def table(self) -> list[tuple[str, int, int, int, int]]:
        """``(chapter, passed, failed, skipped, errors)`` rows for a summary table."""
        return [(c.name, c.passed, c.failed, c.skipped, c.errors) for c in self.chapters.values()]

    def problems(self) -> list[CheckResult]:
        return [c for c in self.checks if c.outcome in ("failed", "error")]

    def deviations(self) -> list[CheckResult]:
        """Checks that failed on a rule the CA declares it breaks (reported, not hidden)."""
        return [c for c in self.checks if c.outcome == "xfailed"]

    def summary_line(self) -> str:
        """pytest's closing line: ``"3 failed, 270 passed, 12 skipped, 2 xfailed in 5.10s"``."""
        parts = [
            f"{n} {word}"
            for n, word in (
                (self.failed, "failed"),
                (self.passed, "passed"),
                (self.skipped, "skipped"),
                (self.xfailed, "xfailed"),
                (self.errors, "error" if self.errors == 1 else "errors"),
            )
            if n
        ]
        return f"{', '.join(parts) or 'no tests ran'} in {self.duration:.2f}s"


class Reporter(Protocol):
    """Progress callbacks of :func:`run_conformance` (all optional to act on)."""

    def start(self, total: int, chapters: Mapping[str, int]) -> None:
        """Collection done: ``total`` checks, ``chapters`` maps chapter → count."""

    def check_done(self, check: CheckResult) -> None:
        """One check finished (after its teardown)."""

    def finish(self, result: RunResult) -> None:
        """The run ended."""


class _Collector:
    """The pytest plugin that feeds a :class:`RunResult` and a :class:`Reporter`."""

    def __init__(self, reporter: Reporter | None) -> None:
        self.reporter = reporter
        self.result = RunResult(exit_code=-1)
        self._chapter: dict[str, str] = {}
        self._pending: dict[str, CheckResult] = {}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        counts: dict[str, int] = {}
        for item in session.items:
            name = chapter_of(item) or NO_CHAPTER
            self._chapter[item.nodeid] = name
            counts[name] = counts.get(name, 0) + 1
            self.result.chapters.setdefault(name, ChapterResult(name))
        if self.reporter is not None:
            self.reporter.start(len(session.items), counts)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        chapter = self._chapter.get(nodeid, NO_CHAPTER)
        check = self._pending.setdefault(nodeid, CheckResult(nodeid, chapter, "passed"))
        if report.when == "call":
            if report.failed:
                check.outcome, check.message = "failed", _message(report)
            elif report.skipped and hasattr(report, "wasxfail"):
                check.outcome, check.message = "xfailed", str(report.wasxfail)
            elif report.skipped:
                check.outcome, check.message = "skipped", _skip_reason(report)
        elif report.failed:  # setup or teardown
            if check.outcome != "failed":
                check.outcome, check.message = "error", _message(report)
        elif report.skipped and report.when == "setup":
            check.outcome, check.message = "skipped", _skip_reason(report)
        if report.when == "teardown":
            self._finish(self._pending.pop(nodeid))

    def _finish(self, check: CheckResult) -> None:
        r = self.result
        r.checks.append(check)
        r.chapters.setdefault(check.chapter, ChapterResult(check.chapter)).add(check.outcome)
        if check.outcome == "passed":
            r.passed += 1
        elif check.outcome == "failed":
            r.failed += 1
        elif check.outcome == "skipped":
            r.skipped += 1
        elif check.outcome == "xfailed":
            r.xfailed += 1
        else:
            r.errors += 1
        if self.reporter is not None:
            self.reporter.check_done(check)


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return _message(report)


def conformance_args(
    provider: str, options: Mapping[str, Any], extra_args: Sequence[str] = ()
) -> list[str]:
    """The pytest arguments that run the suite against ``provider`` with ``options``."""
    args = ["--ibal-provider", provider]
    for key, value in options.items():
        args += ["--ibal-provider-option", f"{key}={json.dumps(value)}"]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args = ["-p", "ibal.testing.plugin", *args]
    return [*args, "-p", "no:cacheprovider", *extra_args]


def run_conformance(
    provider: str,
    options: Mapping[str, Any] | None = None,
    *,
    extra_args: Sequence[str] = (),
    reporter: Reporter | None = None,
) -> RunResult:
    """Run every conformance check against ``provider`` in this process.

    ``extra_args`` go to pytest (``-k``, ``-x``, ``-q``...).  The returned
    :class:`RunResult` has totals, per-chapter totals and each check's outcome.
    """
    return run_pytest(conformance_args(provider, options or {}, extra_args), reporter=reporter)


def run_pytest(
    args: Sequence[str],
    *,
    reporter: Reporter | None = None,
    plugins: Sequence[object] = (),
) -> RunResult:
    """Run pytest in this process with ``args`` and collect a :class:`RunResult`.

    The general form of :func:`run_conformance`: ``args`` may name a test module
    of its own (a ``ProviderConformance`` subclass) and ``plugins`` are extra
    pytest plugin objects (they may define fixtures).  pytest is not re-entrant
    across threads: run one at a time per process.
    """
    collector = _Collector(reporter)
    start = time.monotonic()
    code = pytest.main(list(args), plugins=[collector, *plugins])
    collector.result.duration = time.monotonic() - start
    collector.result.exit_code = int(code)
    if reporter is not None:
        reporter.finish(collector.result)
    return collector.result
