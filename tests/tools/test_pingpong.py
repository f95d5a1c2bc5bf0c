"""``ibal pingpong`` on the mock: server and client threads over localhost TCP, one fabric.

The wire format is checked against a capture of the real tool's exchange
(docs: ../shared/spec/roce-wire.md 3.6); the lab tests run it against the real
``ibv_rc_pingpong`` / ``ibv_ud_pingpong``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

import ibal
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


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        yield al


def _names(al: AccessLayer) -> list[str]:
    names = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        names.append(ca.name)
        ca.close(wait=True)
    return names


def pair(
    al: AccessLayer, **kw: object
) -> tuple[PingpongResult, PingpongResult, list[str], list[str]]:
    """Run server (first CA) and client (second CA) in two threads; return both results."""
    server_dev, client_dev = _names(al)[:2]
    listener = socket.create_server(("127.0.0.1", 0), backlog=1)
    port = listener.getsockname()[1]
    s_out: list[str] = []
    c_out: list[str] = []
    results: dict[str, PingpongResult | BaseException] = {}

    def serve() -> None:
        try:
            opts = PingpongOptions(device=server_dev, port=port, **kw)  # type: ignore[arg-type]
            results["server"] = run(al, opts, listener=listener, out=s_out.append)
        except BaseException as exc:  # reported by the main thread
            results["server"] = exc

    t = threading.Thread(target=serve)
    t.start()
    copts = PingpongOptions(servername="127.0.0.1", device=client_dev, port=port, **kw)  # type: ignore[arg-type]
    try:
        client = run(al, copts, out=c_out.append)
    finally:
        t.join(60)
    server = results["server"]
    if isinstance(server, BaseException):
        raise server
    return server, client, s_out, c_out


@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("size", [1, 4096, 1 << 20])
def test_rc_pingpong_moves_the_bytes_both_ways(al: AccessLayer, size: int, events: bool) -> None:
    iters = 20 if size < (1 << 20) else 3
    server, client, _, c_out = pair(al, size=size, iters=iters, rx_depth=8, use_event=events)
    for res in (server, client):
        assert res.sent == res.received == iters
        assert res.bytes == size * iters * 2
    assert client.remote == server.local and server.remote == client.local
    assert c_out[0].startswith("  local address:  LID 0x") and "remote address:" in c_out[1]
    assert c_out[2].startswith(f"{size * iters * 2} bytes in ")
    assert c_out[3].startswith(f"{iters} iters in ") and c_out[3].endswith(" usec/iter")


def test_rx_depth_refill_keeps_going_past_the_depth(al: AccessLayer) -> None:
    server, client, _, _ = pair(al, size=64, iters=50, rx_depth=3)
    assert server.received == client.received == 50


def test_ud_pingpong_moves_the_bytes(al: AccessLayer) -> None:
    server, client, s_out, _ = pair(al, ud=True, size=256, iters=20, rx_depth=8)
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
