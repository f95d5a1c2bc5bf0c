"""The ibal command line on the embedded mock fabric."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from ibal.cli import main


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200"})


def test_demo_moves_data_with_every_opcode(runner: CliRunner) -> None:
    result = runner.invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    for op in (
        "SEND",
        "SEND with immediate",
        "RDMA WRITE",
        "RDMA WRITE with immediate",
        "RDMA READ",
        "ATOMIC FETCH_ADD",
        "ATOMIC COMPARE_SWAP",
        "UD SEND",
    ):
        assert re.search(rf"\b{re.escape(op)}\b", result.output), op
    assert "hello, fabric" in result.output
    assert "fetched 41, remote now 42" in result.output
    assert "fetched 42, remote now 7" in result.output
    assert "all operations completed and verified" in result.output


def test_devices_lists_mock_cas(runner: CliRunner) -> None:
    result = runner.invoke(main, ["devices", "-p", "mock", "-o", "cas=3"])
    assert result.exit_code == 0, result.output
    assert {"mock0", "mock1", "mock2"} <= set(re.findall(r"mock\d", result.output))


def test_devices_without_providers_leaves_the_mock_out(runner: CliRunner) -> None:
    result = runner.invoke(main, ["devices"], env={"COLUMNS": "200", "IBAL_PROVIDERS": ""})
    assert result.exit_code == 0, result.output
    assert not re.search(r"mock\d", result.output)
    assert "mock: simulated, not started (-p mock shows its CAs)" in result.output


def test_info_shows_ports_and_limits(runner: CliRunner) -> None:
    result = runner.invoke(main, ["info", "-p", "mock", "mock0"])
    assert result.exit_code == 0, result.output
    assert "CA 'mock0'" in result.output
    assert "ACTIVE" in result.output
    assert re.search(r"GID\[0\]\s+fe80:\S+ \(IB\)", result.output)
    assert "max QP / WR / SGE" in result.output


def test_info_unknown_ca_fails(runner: CliRunner) -> None:
    result = runner.invoke(main, ["info", "-p", "mock", "nosuchca"])
    assert result.exit_code == 1
    assert "no CA nosuchca" in result.output


def test_info_lists_the_capabilities_that_are_off(runner: CliRunner) -> None:
    result = runner.invoke(main, ["info", "-p", "mock", "mock0"])
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stdout.splitlines() if "not supported" in ln]
    assert "apm (" in line
    for has in ("qp_types", "special_qps", "mw_types", "opcodes"):  # those the mock has
        assert has not in line


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["-p", "mock"], {"IBAL_DISABLED_PROVIDERS": "mock"}, "disabled"),
        (["-p", "mock", "-o", "bad=1"], {}, "unknown mock option"),
        (["-p", "nosuch"], {}, "no provider called 'nosuch'"),
        (["-p", "mock", "-o", "cas=0"], {}, "mock"),
    ],
    ids=["disabled", "bad option", "unknown", "no CA"],
)
def test_devices_with_an_unusable_provider_fails_on_stderr(
    runner: CliRunner, args: list[str], env: dict[str, str], says: str
) -> None:
    result = runner.invoke(main, ["devices", *args], env=env)
    assert result.exit_code != 0
    assert says in result.stderr
    assert "CAs" not in result.stdout  # no empty table


def test_conformance_with_a_bad_option_is_one_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(main, ["conformance", "mock", "-o", "bad=1"])
    assert result.exit_code == 2
    assert "unknown mock option" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_conformance_of_an_unknown_provider_fails_on_stderr(runner: CliRunner) -> None:
    result = runner.invoke(main, ["conformance", "nosuch"])
    assert result.exit_code == 2
    assert "no provider called 'nosuch'" in result.stderr and result.stdout == ""
