"""``ibal pingpong`` on the mock: server and client threads over localhost TCP, one fabric.

The wire format is checked against a capture of the real tool's exchange
(docs: ../shared/spec/roce-wire.md 3.6); the lab tests run it against the real
``ibv_rc_pingpong`` / ``ibv_ud_pingpong``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest

from ibal.al import AccessLayer
from ibal.tools.pingpong import (
    PingpongError,
    PingpongOptions,
    PingpongResult,
    WireDest,
    client_exchange,
    result_lines,
    run,
    server_exchange,
)

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


Pair = Callable[..., tuple[PingpongResult, PingpongResult]]


def pingpong(
    pair: Pair, **kw: object
) -> tuple[PingpongResult, PingpongResult, list[str], list[str]]:
    """Server and client results, and the lines each printed."""
    s_out: list[str] = []
    c_out: list[str] = []
    server, client = pair(run, PingpongOptions, s_out=s_out.append, c_out=c_out.append, **kw)
    return server, client, s_out, c_out


@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("size", [1, 4096, 1 << 20])
def test_rc_pingpong_moves_the_bytes_both_ways(pair: Pair, size: int, events: bool) -> None:
    iters = 20 if size < (1 << 20) else 3
    server, client, _, c_out = pingpong(pair, size=size, iters=iters, rx_depth=8, use_event=events)
    for res in (server, client):
        assert res.sent == res.received == iters
        assert res.bytes == size * iters * 2
    assert client.remote == server.local and server.remote == client.local
    assert c_out[0].startswith("  local address:  LID 0x") and "remote address:" in c_out[1]
    assert c_out[2].startswith(f"{size * iters * 2} bytes in ")
    assert c_out[3].startswith(f"{iters} iters in ") and c_out[3].endswith(" usec/iter")


def test_rx_depth_refill_keeps_going_past_the_depth(pair: Pair) -> None:
    server, client, _, _ = pingpong(pair, size=64, iters=50, rx_depth=3)
    assert server.received == client.received == 50


def test_ud_pingpong_moves_the_bytes(pair: Pair) -> None:
    server, client, s_out, _ = pingpong(pair, ud=True, size=256, iters=20, rx_depth=8)
    assert server.sent == server.received == client.sent == client.received == 20
    assert server.bytes == 256 * 20 * 2
    assert ": GID " in s_out[0]  # ud_pingpong's local line has a colon before the GID


def test_ud_refuses_a_size_above_the_mtu(al: AccessLayer) -> None:
    with pytest.raises(PingpongError, match="larger than port MTU"):
        run(al, PingpongOptions(ud=True, size=1 << 16, servername="127.0.0.1"))


def test_wire_format_matches_the_real_tools_capture() -> None:
    wire = b"0000:000021:59dfd7:00000000000000000000ffff0a01103e"
    dest = WireDest.decode(wire + b"\0")
    assert (dest.lid, dest.qpn, dest.psn) == (0, 0x21, 0x59DFD7)
    assert dest.gid == bytes(10) + b"\xff\xff\x0a\x01\x10\x3e"
    assert dest.encode() == wire + b"\0" and len(dest.encode()) == 52
    assert dest.describe("remote") == (
        "  remote address: LID 0x0000, QPN 0x000021, PSN 0x59dfd7, GID ::ffff:10.1.16.62"
    )


@pytest.mark.parametrize("bad", [b"", b"zz", b"0000:000021:59dfd7:00", b"10000:1:1:" + b"0" * 32])
def test_a_malformed_address_is_refused(bad: bytes) -> None:
    with pytest.raises(PingpongError):
        WireDest.decode(bad.ljust(52, b"\0"))


def test_exchange_order_client_sends_first_and_says_done() -> None:
    a, b = socket.socketpair()
    mine, theirs = WireDest(1, 2, 3), WireDest(4, 5, 6)
    seen: list[WireDest] = []
    t = threading.Thread(target=lambda: seen.append(server_exchange(b, theirs, seen.append)))
    t.start()
    assert client_exchange(a, mine, "peer") == theirs
    t.join(10)
    assert seen == [mine, mine]  # connect() saw the client's address before the reply
    a.close()
    b.close()


def test_result_lines_use_the_tools_arithmetic() -> None:
    assert result_lines(8192000, 20000.0, 1000) == [
        "8192000 bytes in 0.02 seconds = 3276.80 Mbit/sec",
        "1000 iters in 0.02 seconds = 20.00 usec/iter",
    ]
