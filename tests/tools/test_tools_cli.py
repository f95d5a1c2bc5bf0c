"""The ``ibal pingpong`` / ``ibal perftest`` commands: options reach the tools, errors exit 1."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ibal.cli import main

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


def test_pingpong_ud_size_above_the_mtu_is_an_error() -> None:
    r = CliRunner().invoke(
        main, ["pingpong", "--provider", "mock", "--ud", "-s", "70000", "127.0.0.1"]
    )
    assert r.exit_code == 1
    assert "Requested size larger than port MTU" in r.output


def test_pingpong_refuses_a_bad_mtu() -> None:
    r = CliRunner().invoke(main, ["pingpong", "--provider", "mock", "-m", "1000", "127.0.0.1"])
    assert r.exit_code == 1 and "invalid MTU 1000" in r.output


def test_pingpong_unknown_device_is_an_error() -> None:
    r = CliRunner().invoke(main, ["pingpong", "--provider", "mock", "-d", "nosuch", "127.0.0.1"])
    assert r.exit_code == 1 and "IB device nosuch not found" in r.output


def test_pingpong_client_without_a_server_says_so(unused_tcp_port: int) -> None:
    r = CliRunner().invoke(
        main, ["pingpong", "--provider", "mock", "-p", str(unused_tcp_port), "127.0.0.1"]
    )
    assert r.exit_code == 1
    assert r.output.startswith("  local address:  LID 0x")
    assert f"Couldn't connect to 127.0.0.1:{unused_tcp_port}" in r.output


def test_perftest_takes_perftests_test_names_only() -> None:
    r = CliRunner().invoke(main, ["perftest", "atomic_bw", "--provider", "mock"])
    assert r.exit_code == 2 and "atomic_bw" in r.output


def test_perftest_client_without_a_server_says_so(unused_tcp_port: int) -> None:
    r = CliRunner().invoke(
        main,
        ["perftest", "write_bw", "--provider", "mock", "-F", "-p", str(unused_tcp_port),
         "127.0.0.1"],
    )  # fmt: skip
    assert r.exit_code == 1 and "Couldn't connect" in r.output


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rping_needs_a_side_and_checks_rpings_limits() -> None:
    r = CliRunner().invoke(main, ["rping", "--provider", "mock", "-a", "10.0.0.1"])
    assert r.exit_code == 2 and "give -s (server) or -c (client)" in r.output
    r = CliRunner().invoke(main, ["rping", "--provider", "mock", "-c", "-a", "10.0.0.1",
                                  "-S", "25"])  # fmt: skip
    assert r.exit_code == 1 and "Invalid size 25 (valid range is 26 to 65536)" in r.output
    r = CliRunner().invoke(main, ["rping", "--provider", "mock", "-c"])
    assert r.exit_code == 1 and "needs the server's address" in r.output


def test_rdma_cm_tools_without_a_roce_port_say_so() -> None:
    """The mock's ports are InfiniBand: no RDMA CM route to an IP address."""
    r = CliRunner().invoke(main, ["rping", "--provider", "mock", "-c", "-a", "10.0.0.1"])
    assert r.exit_code == 1 and "no active RoCE port" in r.output
    r = CliRunner().invoke(main, ["cmtime", "--provider", "mock", "-s", "10.0.0.1"])
    assert r.exit_code == 1 and "no active RoCE port" in r.output
    r = CliRunner().invoke(main, ["udaddy", "--provider", "mock", "-s", "10.0.0.1"])
    assert r.exit_code == 1 and "no active RoCE port" in r.output
    r = CliRunner().invoke(main, ["ucmatose", "--provider", "mock", "-s", "10.0.0.1"])
    assert r.exit_code == 1 and "no active RoCE port" in r.output
    r = CliRunner().invoke(main, ["mckey", "--provider", "mock", "-m", "239.1.1.1", "-s"])
    assert r.exit_code == 1 and "no active RoCE port" in r.output
    r = CliRunner().invoke(main, ["udaddy", "--provider", "mock", "-s", "10.0.0.1", "-c", "0"])
    assert r.exit_code == 1 and "invalid connection count 0" in r.output
    r = CliRunner().invoke(main, ["rping", "--provider", "mock", "-c", "-P", "-a", "10.0.0.1"])
    assert r.exit_code == 1 and "persistent mode (-P) is for the server" in r.output
