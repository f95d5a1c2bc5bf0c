"""``ibal conformance PROVIDER``: the suite with a progress bar and a per-chapter table."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from ibal.testing.runner import CheckResult, RunResult, run_conformance

_STYLE = {
    "passed": "green",
    "failed": "red",
    "skipped": "yellow",
    "xfailed": "magenta",
    "error": "red",
}


class RichReporter:
    """A :class:`~ibal.testing.runner.Reporter` drawing one bar for the whole run.

    pytest runs with ``--capture=sys``, so the bar writes to the real standard
    output; without a terminal there is no bar, only the summary afterwards.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        if console.is_terminal:
            live = Console(file=sys.__stdout__, force_terminal=True, width=console.width)
            self.progress = Progress(
                TextColumn("[bold]{task.description:<30}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                console=live,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
        self.task: TaskID | None = None
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0, "error": 0}

    def start(self, total: int, chapters: Mapping[str, int]) -> None:
        if self.progress is not None:
            self.progress.start()
            self.task = self.progress.add_task("conformance", total=total, status="")

    def check_done(self, check: CheckResult) -> None:
        self.counts[check.outcome] += 1
        if self.progress is None or self.task is None:
            return
        if check.outcome in ("failed", "error"):
            self.progress.console.print(f"[red]{check.outcome.upper()}[/] {check.nodeid}")
        status = " ".join(f"[{_STYLE[k]}]{v} {k}[/]" for k, v in self.counts.items() if v)
        self.progress.update(self.task, advance=1, description=check.chapter, status=status)

    def finish(self, result: RunResult) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.stop()


def summary_table(result: RunResult) -> Table:
    table = Table(title="ibal conformance")
    for col, style in (
        ("chapter", ""),
        ("passed", "green"),
        ("failed", "red"),
        ("skipped", "yellow"),
        ("deviations", "magenta"),
        ("errors", "red"),
    ):
        table.add_column(col, style=style, justify="left" if not style else "right")
    for chapter in result.chapters.values():
        c = chapter
        table.add_row(
            c.name, str(c.passed), str(c.failed), str(c.skipped), str(c.xfailed), str(c.errors)
        )
    table.add_row(
        "[bold]total",
        str(result.passed),
        str(result.failed),
        str(result.skipped),
        str(result.xfailed),
        str(result.errors),
    )
    return table


def run_cli(
    provider: str, options: Mapping[str, Any], extra: Sequence[str], console: Console
) -> int:
    """Run the suite with progress; print the chapter table, problems and skip reasons.

    Returns the exit status: 0 when nothing failed, 1 otherwise (pytest's own
    status for usage errors and collection problems).
    """
    from ibal.ci import ProviderManager
    from ibal.status import IbError

    try:  # the factory validates the options: one usage error, not a failing suite
        ProviderManager().create(provider, dict(options))
    except (IbError, ValueError, TypeError) as exc:
        Console(stderr=True, soft_wrap=True).print(
            f"Error: provider {provider!r}: {exc}", markup=False, highlight=False
        )
        return 2
    reporter = RichReporter(console)
    pytest_output = io.StringIO()  # pytest's own report goes here; the bar is ours
    with contextlib.redirect_stdout(pytest_output):
        result = run_conformance(
            provider, options, extra_args=["--capture=sys", *extra], reporter=reporter
        )
    if not result.checks:
        console.print(pytest_output.getvalue()[-3000:], markup=False, highlight=False)
        console.print(f"[red]no conformance check ran (pytest exit status {result.exit_code})")
        return result.exit_code or 1
    console.print(summary_table(result))
    for check in result.problems():
        first = (check.message.splitlines() or [""])[0][:240]
        console.print(
            f"[red]{check.outcome.upper()}[/] {check.nodeid.split('::')[-1]} "
            f"[dim]({check.chapter})[/]"
        )
        console.print(f"    {first}", markup=False, highlight=False)
    reasons: dict[str, int] = {}
    for check in result.checks:
        if check.outcome == "skipped":
            reasons[check.message] = reasons.get(check.message, 0) + 1
    for reason, n in sorted(reasons.items()):
        console.print(f"[yellow]skipped {n}[/]: {reason}")
    deviations = result.deviations()
    for check in deviations:
        console.print(
            f"[magenta]DEVIATION[/] {check.nodeid.split('::')[-1]} [dim]({check.chapter})[/]"
        )
        console.print(f"    {check.message[:300]}", markup=False, highlight=False)
    if deviations:
        console.print(
            f"[magenta]not conformant: {len(deviations)} check(s) fail on rules the provider "
            "declares it breaks (Capabilities.deviations)"
        )
    # pytest's own closing line, last, as `pytest --ibal-provider` prints it.
    console.print(result.summary_line(), markup=False, highlight=False)
    return 0 if result.ok else 1
