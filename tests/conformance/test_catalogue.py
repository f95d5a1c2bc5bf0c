"""The suite itself: size, rule references, generated docs, plugin and runner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ibal.testing import catalogue
from ibal.testing.runner import RunResult, run_conformance


def test_suite_has_at_least_150_distinct_checks() -> None:
    checks = catalogue.checks()
    assert len({c.name for c in checks}) == len(checks), "two chapters define the same check"
    assert len(checks) >= 150


def test_every_check_names_its_rule() -> None:
    assert catalogue.problems(catalogue.checks()) == []


def test_every_rule_is_proved_or_a_gap_with_a_reason() -> None:
    assert catalogue.rule_problems(catalogue.checks()) == []


def test_rules_marker_refuses_unknown_ids() -> None:
    from ibal.testing.rules import rules

    for bad in ("ci:0", "ci:101", "al:115", "iba:no-such-statement", "ci-contract 5"):
        with pytest.raises(ValueError, match="unknown rule ids"):
            rules(bad)
    with pytest.raises(ValueError):
        rules()


def test_conformance_page_is_current() -> None:
    text = catalogue.DOC.read_text()
    assert catalogue.updated(text) == text, "docs/conformance.md is stale: " + (
        "python -m ibal.testing.catalogue"
    )


def _pytest_in(directory: Path, args: list[str], monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:  # fmt: skip
    """``pytest ARGS`` run from ``directory`` in this process (plugins autoloaded as on the
    command line; a fresh interpreter would cost ~20 s of imports here): exit code, output."""
    monkeypatch.chdir(directory)
    capsys.readouterr()
    code = int(pytest.main(args))
    return code, capsys.readouterr().out


def test_plugin_runs_suite_from_an_empty_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    only = "test_create_cq_size_at_least_requested or test_rc_send_lands"
    code, out = _pytest_in(tmp_path, ["--ibal-provider", "mock", "-p", "no:cacheprovider",
                                      "-k", only], monkeypatch, capsys)  # fmt: skip
    assert code == 0, out[-3000:]
    assert "ibal conformance: provider 'mock'" in out
    assert "3 passed" in out  # the CQ check and the RC send on both topologies


def test_provider_options_reach_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _pytest_in(tmp_path, ["--ibal-provider", "mock", "--ibal-provider-option", "cas=1",
                                      "-p", "no:cacheprovider", "-rs", "-k", "test_rc_send_lands"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 0, out[-3000:]
    assert "1 passed, 1 skipped" in out
    assert "cross-CA variant: the provider offers one CA" in out


def test_run_conformance_counts_per_chapter() -> None:
    seen: list[str] = []

    class Recorder:
        def start(self, total: int, chapters: object) -> None:
            seen.append(f"start {total}")

        def check_done(self, check: object) -> None:
            seen.append("check")

        def finish(self, result: RunResult) -> None:
            seen.append("finish")

    result = run_conformance(
        "mock",
        {"cas": 2},
        extra_args=["-q", "-k", "PdChecks or test_poll_empty_cq"],
        reporter=Recorder(),
    )
    assert result.exit_code == 0 and result.failed == 0 and result.errors == 0
    assert result.chapters["PD"].passed == result.chapters["PD"].total == 9
    assert result.chapters["CQ & notification"].passed == 1
    assert seen[0] == f"start {result.passed}" and seen[-1] == "finish"
    assert seen.count("check") == result.passed


def test_cli_conformance_command() -> None:
    from ibal.cli import main

    out = CliRunner().invoke(main, ["conformance", "mock", "-k", "test_qp_numbers_are_unique"])
    assert out.exit_code == 0, out.output
    assert "QP create & state machine" in out.output and "total" in out.output
    # The table first, then pytest's usual one-line summary, last.
    last = out.output.strip().splitlines()[-1]
    assert re.fullmatch(r"1 passed in \d+\.\d\ds", last), last
    assert out.output.index("total") < out.output.rindex("1 passed")


def test_cli_conformance_unknown_provider() -> None:
    from ibal.cli import main

    out = CliRunner().invoke(main, ["conformance", "no-such-provider"])
    assert out.exit_code == 2
    assert "no provider called 'no-such-provider'" in out.output
