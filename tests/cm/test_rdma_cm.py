"""``ibal.cm.rdma`` connect/listen between two userspace rxe devices on loopback.

Both ends are ibal here (rdma_cm's rules are checked against Linux in
tests/lab/test_rdma_cm_lab.py): the REQ carries the TCP port-space service ID
and the CMA header, the listener hands over the peer's address and port and
the user's private data, refuses REQs Linux would refuse, and the connection
moves data.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ibal.al import AccessLayer, Pd, QpCreate
from ibal.cm import cma, rdma, simple
from ibal.status import InvalidParameter, InvalidSetting, Timeout
from ibal.testing.helpers import ServerThread, rxe_al
from ibal.tools.common import ExchangeOptions, ExchangeResult
from ibal.tools.rping import RpingError, RpingOptions, run
from ibal.tools.rping_proto import ping_text
from ibal.types import (
    AccessFlags,
    Gid,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    WcStatus,
    WrType,
)
from ibal.wire.mad.cm import RejReason

A, B = "127.0.0.61", "127.0.0.62"
WAIT = 20.0
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


@pytest.fixture(scope="module")
def al() -> Iterator[AccessLayer]:
    with rxe_al(f"rxe_rc0={A},rxe_rc1={B}", timeout=WAIT) as al:
        yield al


def _pd(al: AccessLayer, ip: str) -> Pd:
    route = rdma.resolve_route(al, ip, src=ip)
    return al.open_ca(route.ca_guid).alloc_pd()


def _accept_in_thread(lst: rdma.RdmaListener, pd: Pd, out: dict[str, object]) -> threading.Thread:
    def serve() -> None:
        try:
            inc = lst.get(WAIT)
            out["incoming"] = inc
            cq = pd.ca.create_cq(16)
            qp = pd.create_qp(QpCreate(QpType.RC, cq, cq))
            out["cq"], out["qp"] = cq, qp
            out["conn"] = inc.accept(qp, b"welcome", timeout=WAIT)
        except Exception as e:  # handed to the test thread
            out["error"] = e

    t = threading.Thread(target=serve)
    t.start()
    return t


def test_connect_and_listen_carry_rdma_cms_header(al: AccessLayer) -> None:
    pa, pb = _pd(al, A), _pd(al, B)
    out: dict[str, object] = {}
    with rdma.listen(al, 7301, addr=A) as lst:
        t = _accept_in_thread(lst, pa, out)
        cq = pb.ca.create_cq(16)
        qp = pb.create_qp(QpCreate(QpType.RC, cq, cq))
        conn = rdma.connect(al, A, 7301, qp, b"hello", src=B, src_port=40001, timeout=WAIT)
        t.join(WAIT)
    assert "error" not in out, out.get("error")
    inc = out["incoming"]
    assert isinstance(inc, rdma.RdmaIncoming)
    assert inc.src == (ipaddress.IPv4Address(B), 40001)
    assert inc.dst == (ipaddress.IPv4Address(A), 7301)
    assert inc.private_data == b"hello" + bytes(51)  # a REQ's private data is fixed-size
    req = inc.incoming.fields
    assert req["service_id"] == 0x0000000001061C85  # TCP port space, port 7301
    pdata = req["private_data"]
    assert isinstance(pdata, bytes)
    assert pdata[:4] == bytes([0, 0x40, 40001 >> 8, 40001 & 0xFF])
    assert pdata[4:36] == bytes(12) + bytes([127, 0, 0, 62]) + bytes(12) + bytes([127, 0, 0, 61])
    assert (req["remote_cm_response_timeout"], req["local_cm_response_timeout"]) == (20, 20)
    assert (req["max_cm_retries"], req["primary_local_lid"]) == (15, 0xFFFF)
    assert conn.private_data[:7] == b"welcome"
    assert conn.local == (ipaddress.IPv4Address(B), 40001)
    assert conn.remote == (ipaddress.IPv4Address(A), 7301)
    assert conn.route is not None and conn.route.src == ipaddress.IPv4Address(B)

    # the connection moves data, then goes
    server = out["conn"]
    assert isinstance(server, rdma.RdmaConnection)
    sqp, scq = out["qp"], out["cq"]
    buf = bytearray(64)
    mr_s = pa.reg_mem(buf, ACCESS)
    sqp.post_recv(RecvWr(1, [mr_s.sge(0, 64)]))  # type: ignore[attr-defined]
    src = bytearray(b"over rdma_cm!")
    mr_c = pb.reg_mem(src, ACCESS)
    qp.post_send(SendWr(2, WrType.SEND, [mr_c.sge(0, len(src))]))
    wc = _wait(scq)
    assert (wc.status, wc.length, bytes(buf[:13])) == (WcStatus.SUCCESS, 13, b"over rdma_cm!")
    conn.disconnect(timeout=WAIT)
    assert qp.state is QpState.ERROR


def _wait(cq: object) -> object:
    from ibal.testing.helpers import wait_wc

    return wait_wc(cq, WAIT)  # type: ignore[arg-type]


def test_requests_linux_would_refuse_are_rejected_and_counted(al: AccessLayer) -> None:
    pa, pb = _pd(al, A), _pd(al, B)
    cq = pb.ca.create_cq(16)
    route = rdma.resolve_route(al, A, src=B)
    with rdma.listen(al, 7302, addr=A) as lst:
        # no CMA header (version 1): Linux's cma_save_ip_info refuses it
        qp = pb.create_qp(QpCreate(QpType.RC, cq, cq))
        with pytest.raises(simple.ConnectionRejected) as e:
            simple.connect(al, qp, route.path, cma.service_id(cma.PortSpace.TCP, 7302),
                           bytes([1, 0x40]) + bytes(34), timeout=WAIT)  # fmt: skip
        assert e.value.reason == RejReason.CONSUMER_DEFINED
        # a header naming another address than the listener's
        qp = pb.create_qp(QpCreate(QpType.RC, cq, cq))
        hdr = cma.CmaHeader(route.src, ipaddress.IPv4Address("127.0.0.99"), 1234)
        with pytest.raises(simple.ConnectionRejected) as e:
            simple.connect(al, qp, route.path, cma.service_id(cma.PortSpace.TCP, 7302),
                           hdr.encode(), timeout=WAIT)  # fmt: skip
        assert e.value.reason == RejReason.INVALID_SERVICE_ID
        with pytest.raises(Timeout):
            lst.get(0)  # the user saw neither
    assert lst.stats == {"bad header": 1, "other address": 1}
    del pa


def test_bad_arguments_are_refused(al: AccessLayer) -> None:
    pb = _pd(al, B)
    cq = pb.ca.create_cq(4)
    qp = pb.create_qp(QpCreate(QpType.RC, cq, cq))
    with pytest.raises(InvalidParameter, match="at most 56 bytes"):
        rdma.connect(al, A, 7303, qp, bytes(57), src=B)
    with pytest.raises(InvalidParameter, match="TCP or IB port space"):
        rdma.connect(al, A, 7303, qp, ps=cma.PortSpace.UDP, src=B)


@pytest.mark.parametrize(("size", "count"), [(64, 3), (5000, 10)])
def test_ibal_rping_both_ends(al: AccessLayer, size: int, count: int) -> None:
    port = 7310 + count
    srv = ServerThread(lambda listening: run(
        al, RpingOptions(server=True, addr=A, port=port, size=size, verbose=True, timeout=WAIT),
        out=lambda _: None, listening=listening))  # fmt: skip
    srv.wait_listening(WAIT)
    lines: list[str] = []
    client = run(al, RpingOptions(server=False, addr=A, source=B, port=port, size=size,
                                  count=count, verbose=True, validate=True, timeout=WAIT),
                 out=lines.append)  # fmt: skip
    server = srv.result(WAIT)
    assert client.pings == count == server.pings
    assert lines[-1] == "ping data: " + ping_text(count - 1, size)[:-1].decode()
    assert server.lines[0] == "server ping data: " + ping_text(0, size)[:-1].decode()


def test_ibal_rping_persistent_server_serves_clients_in_turn_and_at_once(
    al: AccessLayer,
) -> None:
    """``rping -s -P``: one listen serves a client, then three at once (a thread each),
    then still listens; ``stop`` ends it once the clients are done, with every ping."""
    port = 7330
    stop = threading.Event()
    errs: list[str] = []
    srv = ServerThread(lambda listening: run(
        al, RpingOptions(server=True, addr=A, port=port, size=100, verbose=True, timeout=WAIT,
                         persistent=True),
        out=lambda _: None, err=errs.append, listening=listening, stop=stop))  # fmt: skip

    def client(count: int) -> int:
        opts = RpingOptions(server=False, addr=A, source=B, port=port, size=100, count=count,
                            validate=True, timeout=WAIT)  # fmt: skip
        return run(al, opts, out=lambda _: None).pings

    try:
        srv.wait_listening(WAIT)
        assert client(2) == 2
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            assert list(pool.map(client, (3, 4, 5))) == [3, 4, 5]
        assert client(1) == 1  # still listening
    finally:
        stop.set()
    assert srv.result(WAIT).pings == 2 + 3 + 4 + 5 + 1
    assert errs.count("server DISCONNECT EVENT...") == 5 and len(errs) == 5, errs
    with pytest.raises(RpingError, match="for the server"):
        run(al, RpingOptions(server=False, addr=A, persistent=True))


Ends = tuple[ExchangeResult, ExchangeResult, dict[str, list[str]]]


def _both_ends(al: AccessLayer, run: Callable[..., ExchangeResult],
               options: Callable[..., ExchangeOptions], **opts: Any) -> Ends:
    """One of the librdmacm example tools at both ends: its server on A in a thread, its
    client from B; both results and the lines each printed."""
    lines: dict[str, list[str]] = {"server": [], "client": []}
    srv = ServerThread(lambda listening: run(
        al, options(bind=A, timeout=WAIT, **opts), out=lines["server"].append,
        listening=listening))  # fmt: skip
    srv.wait_listening(WAIT)
    client = run(al, options(server=A, bind=B, timeout=WAIT, **opts),
                 out=lines["client"].append)  # fmt: skip
    return srv.result(WAIT), client, lines


@pytest.mark.parametrize(("connections", "count", "size"), [(1, 10, 100), (3, 4, 1000)])
def test_ibal_udaddy_both_ends(al: AccessLayer, connections: int, count: int,
                               size: int) -> None:  # fmt: skip
    """``ibal udaddy``: SIDR per peer, ``count`` datagrams each way per peer; every one
    lands whole and in order (message ``i`` is bytes ``i``), udaddy's lines printed."""
    from ibal.tools.udaddy import UdaddyOptions
    from ibal.tools.udaddy import run as udaddy

    port = 7340 + connections
    server, client, lines = _both_ends(al, udaddy, UdaddyOptions, connections=connections,
                                       count=count, size=size, port=port)  # fmt: skip
    want = [[bytes([i]) * size for i in range(count)]] * connections
    assert server.received == want == client.received
    assert lines["client"] == ["udaddy: starting client", "udaddy: connecting",
                               "initiating data transfers", "receiving data transfers",
                               "data transfers complete", "test complete", "return status 0"]
    assert lines["server"] == ["udaddy: starting server", "receiving data transfers",
                               "sending replies", "data transfers complete", "test complete",
                               "return status 0"]  # fmt: skip


@pytest.mark.parametrize("nodes", [1, 2])
def test_ibal_mckey_sender_and_receivers(al: AccessLayer, nodes: int) -> None:
    """``ibal mckey``: receivers on one device and a sender on the other join 239.1.2.4;
    each receiving node takes every datagram (message ``i`` is bytes ``i``), once."""
    from ibal.tools.mckey import MckeyOptions
    from ibal.tools.mckey import run as mckey

    group, count, size = "239.1.2.4", 6, 200
    lines: list[str] = []
    srv = ServerThread(lambda joined: mckey(
        al, MckeyOptions(group=group, bind=A, connections=nodes, count=count, size=size,
                         timeout=WAIT), out=lines.append, joined=joined))  # fmt: skip
    srv.wait_listening(WAIT)
    sent = mckey(al, MckeyOptions(group=group, sender=True, bind=B, count=count, size=size,
                                  delay=0, timeout=WAIT), out=lambda _: None)  # fmt: skip
    got = srv.result(WAIT).received
    assert sent.received == [[]]
    assert got == [[bytes([i]) * size for i in range(count)]] * nodes
    assert lines[:3] == ["mckey: starting server", "mckey: joining",
                         "mckey: joined dgid: ::ffff:239.1.2.4 mlid 0x0 sl 0"]  # fmt: skip
    assert lines[-4:] == ["receiving data transfers", "data transfers complete",
                          "test complete", "return status 0"]  # fmt: skip


def test_multicast_join_refusals(al: AccessLayer) -> None:
    """What rdma_join_multicast refuses: a unicast address, a QP that is not UD or has
    another Q_Key than RDMA_UDP_QKEY, a source of the other IP version."""
    from ibal.cm.rdma_mcast import join_multicast
    from ibal.tools.udaddy import UdEnd

    pd = _pd(al, A)
    end = UdEnd(pd, 1, 1, 8)
    with pytest.raises(InvalidParameter, match="not a multicast address"):
        join_multicast(end.qp, A)
    with pytest.raises(InvalidParameter, match="not an IP address"):
        join_multicast(end.qp, "nowhere")
    with pytest.raises(InvalidParameter, match="different IP versions"):
        join_multicast(end.qp, "239.1.2.5", src="::1")
    m = join_multicast(end.qp, "239.1.2.5")
    assert (m.qpn, m.qkey, m.av.grh.dgid if m.av.grh else None) == (
        0xFFFFFF, cma.RDMA_UDP_QKEY, Gid("::ffff:239.1.2.5"))  # fmt: skip
    m.leave()
    rc = pd.create_qp(QpCreate(QpType.RC, end.cq, end.cq))
    rc.modify(QpMod(QpState.INIT, port_num=1, pkey_index=0, access=AccessFlags.LOCAL_WRITE))
    with pytest.raises(InvalidSetting, match="takes a UD QP, not RC"):
        join_multicast(rc, "239.1.2.5")
    ud = pd.create_qp(QpCreate(QpType.UD, end.cq, end.cq))
    ud.modify(QpMod(QpState.INIT, port_num=1, pkey_index=0, qkey=0x1111))
    with pytest.raises(InvalidSetting, match="Q_Key is 0x1111"):
        join_multicast(ud, "239.1.2.5")
    for q in (rc, ud):
        q.destroy()
    end.close()


@pytest.mark.parametrize(("connections", "count", "size"), [(1, 10, 100), (3, 5, 3000)])
def test_ibal_ucmatose_both_ends(al: AccessLayer, connections: int, count: int,
                                 size: int) -> None:  # fmt: skip
    """``ibal ucmatose``: the server sends ``count`` messages on each connection, the
    client sends as many back, the server disconnects; every message lands whole and in
    order (message ``i`` is bytes ``i``), cmatose's lines printed."""
    from ibal.tools.cmatose import CmatoseOptions
    from ibal.tools.cmatose import run as cmatose

    server, client, lines = _both_ends(al, cmatose, CmatoseOptions, connections=connections,
                                       count=count, size=size, port=7350 + count)  # fmt: skip
    want = [[bytes([i]) * size for i in range(count)]] * connections
    assert server.received == want == client.received
    assert lines["client"] == ["cmatose: starting client", "cmatose: connecting",
                               "receiving data transfers", "sending replies",
                               "data transfers complete", "test complete", "return status 0"]
    assert lines["server"] == ["cmatose: starting server", "initiating data transfers",
                               "completing sends", "receiving data transfers",
                               "data transfers complete", "cmatose: disconnecting",
                               "disconnected", "test complete", "return status 0"]  # fmt: skip


def test_ibal_cmtime_both_ends(al: AccessLayer) -> None:
    from ibal.tools.cmtime import CmtimeOptions, CmtimeServer, run_client

    lines: list[str] = []
    with CmtimeServer(al, 7471, addr=A) as srv:
        res = run_client(al, CmtimeOptions(server=A, bind=B, connections=30), out=lines.append)
        assert srv.wait(lambda s: s.disconnected >= 30, WAIT)
        assert (srv.answered, srv.failures()) == (30, 0)
    assert res.failed == 0 and len(res.each["connect"]) == 30
    assert lines[:5] == ["resolving route", "creating qp", "connecting", "disconnecting",
                         "destroying qp"]  # fmt: skip
    assert lines[5].startswith("step") and lines[8].startswith("connect      :")


def test_cmtime_counts_refused_connections(al: AccessLayer) -> None:
    from ibal.tools.cmtime import CmtimeOptions, run_client

    lines: list[str] = []
    res = run_client(al, CmtimeOptions(server=A, bind=B, connections=3, port=7499),
                     out=lines.append)  # fmt: skip
    assert res.failed == 3 and any(line.startswith("3 of 3 connections failed") for line in lines)
    assert res.each["disconnect"] == []


def test_udp_port_space_resolves_a_ud_qp_and_a_datagram_lands(al: AccessLayer) -> None:
    from ibal.cm.cma import RDMA_UDP_QKEY
    from ibal.types import QpMod, UdDest

    pa, pb = _pd(al, A), _pd(al, B)
    cq_a = pa.ca.create_cq(16)
    ud_a = pa.create_qp(QpCreate(QpType.UD, cq_a, cq_a))
    for mod in (QpMod(QpState.INIT, port_num=1, pkey_index=0, qkey=RDMA_UDP_QKEY),
                QpMod(QpState.RTR), QpMod(QpState.RTS, sq_psn=0)):  # fmt: skip
        ud_a.modify(mod)
    buf = bytearray(256)
    mr_a = pa.reg_mem(buf, AccessFlags.LOCAL_WRITE)
    ud_a.post_recv(RecvWr(1, [mr_a.sge(0, 40 + 64)]))
    seen: list[rdma.RdmaIncoming] = []

    def arrived(inc: rdma.RdmaIncoming) -> None:  # misc queue
        seen.append(inc)
        inc.answer(ud_a, b"udp ok")

    with rdma.listen(al, 7320, ps=cma.PortSpace.UDP, callback=arrived):
        peer = rdma.resolve_udp(al, A, 7320, b"who?", src=B, src_port=5555)
    assert (peer.qpn, peer.qkey) == (ud_a.num, RDMA_UDP_QKEY)
    assert peer.private_data[:6] == b"udp ok"
    (inc,) = seen
    assert inc.ud and inc.src == (ipaddress.IPv4Address(B), 5555)
    assert inc.private_data[:4] == b"who?" and len(inc.private_data) == 180
    assert inc.incoming.fields["service_id"] == 0x0000000001111C98  # UDP port space
    cq_b = pb.ca.create_cq(16)
    ud_b = pb.create_qp(QpCreate(QpType.UD, cq_b, cq_b))
    for mod in (QpMod(QpState.INIT, port_num=1, pkey_index=0, qkey=RDMA_UDP_QKEY),
                QpMod(QpState.RTR), QpMod(QpState.RTS, sq_psn=0)):  # fmt: skip
        ud_b.modify(mod)
    av = pb.create_av(peer.av)
    msg = bytearray(b"datagram over rdma_cm's UDP space")
    mr_b = pb.reg_mem(msg, AccessFlags.LOCAL_WRITE)
    ud_b.post_send(SendWr(2, WrType.SEND, [mr_b.sge(0, len(msg))],
                          ud=UdDest(av=av, remote_qp=peer.qpn, remote_qkey=peer.qkey)))  # fmt: skip
    wc = _wait(cq_a)
    assert wc.status is WcStatus.SUCCESS  # type: ignore[attr-defined]
    assert bytes(buf[40 : 40 + len(msg)]) == bytes(msg)
