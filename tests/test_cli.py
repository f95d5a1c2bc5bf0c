"""The ibal command line on the embedded mock fabric."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
    assert "mad_agents (" in line
    for has in ("qp_types", "special_qps", "mw_types", "opcodes", "apm"):  # the mock has those
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


# ---------------------------------------------------------------- the process's exit

def _py(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_ibal_process_prints_everything_and_exits_with_the_commands_status() -> None:
    # stdout is a pipe (block-buffered): the fast exit must flush what the command wrote
    r = subprocess.run([sys.executable, "-m", "ibal.cli", "info", "-p", "mock", "-o", "cas=2"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("CA '") == 2 and r.stdout.rstrip().endswith(")"), r.stdout[-300:]
    bad = subprocess.run([sys.executable, "-m", "ibal.cli", "info", "nosuch", "-p", "mock"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 1 and "no CA nosuch" in bad.stderr


def test_exit_now_flushes_runs_atexit_and_keeps_the_status() -> None:
    r = _py("import atexit, sys\n"
            "from ibal.cli import _exit_now\n"
            "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
            "sys.stdout.write('partial line, no newline')\n"
            "_exit_now(3)\n"
            "print('not reached')\n")  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert r.stdout == "partial line, no newline"
    assert "atexit ran" in r.stderr
    msg = _py("from ibal.cli import _exit_now\n_exit_now('a message')\nprint('not reached')")
    assert (msg.returncode, msg.stdout, msg.stderr.strip()) == (1, "", "a message")


def test_exit_now_leaves_a_running_non_daemon_thread_to_the_interpreter() -> None:
    r = _py("import threading, time\n"
            "from ibal.cli import _exit_now\n"
            "t = threading.Thread(target=lambda: (time.sleep(0.2), print('thread done')))\n"
            "t.start()\n"
            "_exit_now(0)\n"
            "print('returned')\n")  # fmt: skip
    assert r.returncode == 0
    assert r.stdout.split() == ["returned", "thread", "done"]


def test_the_mock_plugin_imports_none_of_the_mock() -> None:
    # the default providers import it to learn the mock is simulated, then leave it out
    r = _py("import sys\n"
            "import ibal.providers.mock.plugin\n"
            "print(sorted(m for m in sys.modules if m.startswith('ibal.providers.mock.')))\n"
            "from ibal.providers.mock import MockFabric, MockProvider\n"
            "print(MockFabric.__module__, MockProvider.__module__)\n")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "['ibal.providers.mock.plugin']",
        "ibal.providers.mock.fabric ibal.providers.mock.provider",
    ]


def test_exit_now_leaves_a_profiled_process_to_the_interpreter(tmp_path: Path) -> None:
    # cProfile (and coverage) write their data after the program returns
    out = tmp_path / "prof.out"
    script = tmp_path / "ends.py"
    script.write_text("from ibal.cli import _exit_now\n_exit_now(0)\nprint('returned')\n")
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), str(script)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "returned"
    assert out.stat().st_size > 0
