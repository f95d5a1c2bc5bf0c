"""rping's protocol (ibal.tools.rping_proto) and its verbs driver (ibal.tools.rping).

The machines are checked event by event against librdmacm's rping.c facts
(roce-wire.md 3.6); the driver runs a client and a server over two mock CAs
whose QPs are connected by hand (the CM half is tested in tests/cm and, against
the unmodified rping, in tests/lab/test_rdma_cm_lab.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import ibal
from ibal.al import AccessLayer
from ibal.al.connect import ConnectOptions, connect_qp, endpoint
from ibal.testing.helpers import active_port
from ibal.tools.rping import RpingEndpoint, RpingError
from ibal.tools.rping_proto import (
    INFO,
    Check,
    Disconnect,
    Disconnected,
    Fill,
    Finish,
    GoAhead,
    PostRead,
    PostRecv,
    PostWrite,
    Print,
    ReadDone,
    Recv,
    Region,
    RpingClient,
    RpingServer,
    SendInfo,
    WriteDone,
    ping_text,
)
from ibal.types import AccessFlags

SRC = Region(0x1000, 0xAA, 64)
SINK = Region(0x2000, 0xAA, 64)


def test_info_is_16_big_endian_bytes() -> None:
    raw = Region(0x0102030405060708, 0x11223344, 64).info()
    assert raw.hex() == "0102030405060708" + "11223344" + "00000040"
    assert Region.from_info(raw) == Region(0x0102030405060708, 0x11223344, 64)
    assert INFO.size == 16


def test_ping_text_is_rpings() -> None:
    t = ping_text(0, 64)
    assert t.startswith(b"rdma-ping-0: ABCDEFGHIJ") and t[-1] == 0 and len(t) == 64
    assert t[13:63] == bytes(range(65, 115))  # 'A'.. for the 50 bytes after the prefix
    # each ping starts one letter later; the letters wrap from 'z' to 'A'
    assert ping_text(2, 64).startswith(b"rdma-ping-2: CDEF")
    assert ping_text(57, 30)[14:17] == b"zAB"
    assert ping_text(58, 30)[14:16] == b"AB"  # 58 letters from 'A' to 'z': a full turn
    assert b"\0" not in ping_text(3, 26)[:-1]


def test_client_pings_then_disconnects() -> None:
    c = RpingClient(SRC, SINK, count=2, verbose=True, validate=True)
    assert c.start() == [Fill(0), SendInfo(SRC.info())]
    go = Recv(bytes(16))
    assert c.handle(go) == [PostRecv(), SendInfo(SINK.info())]
    assert c.handle(go) == [PostRecv(), Check(0), Print("ping data: "), Fill(1),
                            SendInfo(SRC.info())]  # fmt: skip
    assert c.handle(go) == [PostRecv(), SendInfo(SINK.info())]
    assert c.handle(go) == [PostRecv(), Check(1), Print("ping data: "), Disconnect(), Finish()]
    assert c.handle(go) == []  # over


def test_client_refuses_bogus_sizes_and_early_disconnects() -> None:
    c = RpingClient(SRC, SINK, count=0, verbose=False, validate=False)
    c.start()
    assert c.handle(Recv(bytes(15))) == [Finish("Received bogus data, size 15")]
    c = RpingClient(SRC, SINK, count=0, verbose=False, validate=False)
    c.start()
    (fin,) = c.handle(Disconnected())
    assert isinstance(fin, Finish) and "ping 0" in fin.error


def test_server_reads_then_writes_back_and_ends_on_disconnect() -> None:
    s = RpingServer(64, verbose=True)
    assert s.handle(Recv(SRC.info())) == [PostRecv(), PostRead(SRC, 64)]
    assert s.handle(ReadDone(63)) == [Print("server ping data: "), GoAhead()]
    assert s.handle(Recv(SINK.info())) == [PostRecv(), PostWrite(SINK, 64)]  # strlen + 1
    assert s.handle(WriteDone()) == [GoAhead()]
    assert s.pings == 1
    assert s.handle(Disconnected()) == [Finish()]


def test_server_refuses_what_rping_cannot_do() -> None:
    s = RpingServer(64, verbose=False)
    (fin,) = s.handle(Recv(Region(1, 2, 100).info()))
    assert isinstance(fin, Finish) and "same -S" in fin.error
    s = RpingServer(64, verbose=False)
    assert s.handle(Recv(bytes(17))) == [Finish("Received bogus data, size 17")]
    s = RpingServer(64, verbose=False)
    s.handle(Recv(SRC.info()))
    (fin,) = s.handle(WriteDone())
    assert isinstance(fin, Finish) and "unexpected WriteDone" in fin.error
    s = RpingServer(64, verbose=False)
    s.handle(Recv(SRC.info()))
    (fin,) = s.handle(Disconnected())
    assert isinstance(fin, Finish) and "reading" in fin.error


# ------------------------------------------------------------ over the mock


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")
    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        yield al


def _pair(al: AccessLayer, size: int) -> tuple[RpingEndpoint, RpingEndpoint]:
    ends = []
    for guid, client in zip(al.get_ca_guids()[:2], (False, True), strict=True):
        ca = al.open_ca(guid)
        ends.append(RpingEndpoint(ca.alloc_pd(), size, client=client))
    server, client = ends
    eps = []
    for e in ends:
        port = active_port(e.qp.pd.ca.query().ports)
        assert port is not None
        eps.append(endpoint(e.qp, port.port_num, psn=0))
    opts = ConnectOptions(access=AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE, resp_res=1,
                          init_depth=1)  # fmt: skip
    connect_qp(server.qp, eps[0], eps[1], options=opts)
    connect_qp(client.qp, eps[1], eps[0], options=opts)
    return server, client


@pytest.mark.parametrize(("size", "count"), [(64, 1), (100, 5), (65535, 2)])
def test_client_and_server_ping_over_the_mock(al: AccessLayer, size: int, count: int) -> None:
    server, client = _pair(al, size)
    server.post_recv()
    client.post_recv()
    gone = threading.Event()
    out: dict[str, object] = {}

    def serve() -> None:
        try:
            out["server"] = server.run(server.server_machine(verbose=True), closed=gone.is_set,
                                       out=lambda _: None, timeout=30)  # fmt: skip
        except Exception as e:  # handed to the test thread
            out["server"] = e

    t = threading.Thread(target=serve)
    t.start()
    res = client.run(client.client_machine(count, verbose=True, validate=True),
                     disconnect=gone.set, out=lambda _: None, timeout=30)  # fmt: skip
    t.join(30)
    assert res.pings == count
    assert res.lines[-1] == "ping data: " + ping_text(count - 1, size)[:-1].decode()
    srv = out["server"]
    assert not isinstance(srv, Exception), srv
    assert srv.pings == count  # type: ignore[attr-defined]
    assert srv.lines[0] == "server ping data: " + ping_text(0, size)[:-1].decode()  # type: ignore[attr-defined]
    assert client.rdma_buf == ping_text(count - 1, size)  # the sink got the last ping back


def test_a_corrupted_echo_fails_validation(al: AccessLayer) -> None:
    """A server that writes back something else: rping -V says "data mismatch!"."""
    server, client = _pair(al, 64)
    server.post_recv()
    client.post_recv()
    machine = server.server_machine(verbose=False)
    real = machine.handle

    def corrupting(event: object) -> list[object]:
        actions = real(event)  # type: ignore[arg-type]
        if isinstance(event, ReadDone):
            server.buf[32 + 20] ^= 0xFF  # the landed ping, before it is written back
        return actions  # type: ignore[return-value]

    machine.handle = corrupting  # type: ignore[method-assign]
    t = threading.Thread(target=lambda: _quiet(server, machine))
    t.start()
    with pytest.raises(RpingError, match="data mismatch"):
        client.run(client.client_machine(1, verbose=False, validate=True), timeout=30)
    t.join(30)


def _quiet(end: RpingEndpoint, machine: RpingServer) -> None:
    with pytest.raises(RpingError):
        end.run(machine, out=lambda _: None, timeout=2)
