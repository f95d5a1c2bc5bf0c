"""What a channel driver writes: connect_qp/endpoint, cq.wait, GID and P_Key look-ups.

Data moves between two CAs of the mock fabric through the public API only;
the RoCE addressing choices are checked on the pure functions with a RoCE
port record (the mock fabric is InfiniBand).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv6Address

import pytest

import ibal
from ibal.al import AccessLayer, Ca, ConnectOptions, Cq, Endpoint, Mr, Pd, QpCreate
from ibal.al.connect import DEFAULT_QKEY, path_to, preferred_gid, transitions
from ibal.status import (
    InvalidIndex,
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    InvalidQpState,
    NotFound,
)
from ibal.types import (
    AccessFlags,
    GidEntry,
    GidType,
    LinkLayer,
    Mtu,
    NetworkHeader,
    PortAttr,
    QpState,
    QpType,
    RecvOpt,
    RecvWr,
    SendWr,
    WcStatus,
    WcType,
    WrType,
)

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

WAIT = 10.0
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


@dataclass
class Node:
    ca: Ca
    pd: Pd
    cq: Cq
    buf: bytearray
    mr: Mr


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        yield al


def node(al: AccessLayer, i: int) -> Node:
    ca = al.open_ca(al.get_ca_guids()[i])
    pd = ca.alloc_pd()
    buf = bytearray(4096)
    return Node(ca, pd, ca.create_cq(64), buf, pd.reg_mem(buf, ACCESS))


@pytest.fixture
def a(al: AccessLayer) -> Node:
    return node(al, 0)


@pytest.fixture
def b(al: AccessLayer) -> Node:
    return node(al, 1)


# ------------------------------------------------------------------ connect_qp


@pytest.mark.parametrize("qp_type", [QpType.RC, QpType.UC])
def test_connect_qp_moves_data_between_two_cas(a: Node, b: Node, qp_type: QpType) -> None:
    qa = a.pd.create_qp(QpCreate(qp_type, a.cq, a.cq))
    qb = b.pd.create_qp(QpCreate(qp_type, b.cq, b.cq))
    ea, eb = ibal.endpoint(qa, 1, psn=0x1234), ibal.endpoint(qb, 1, psn=0xABCDEF)
    # The records cross "the wire" as dicts (JSON-friendly) and come back equal.
    ea_wire, eb_wire = Endpoint.from_dict(ea.to_dict()), Endpoint.from_dict(eb.to_dict())
    assert eb_wire == Endpoint(qb.num, 0xABCDEF, eb.lid, eb.gid, eb.mtu, eb.qkey)
    path = ibal.connect_qp(qa, ea, eb_wire)
    ibal.connect_qp(qb, eb, ea_wire)
    assert path.dlid == eb.lid and path.grh is None  # same IB subnet: no GRH
    assert qa.state is QpState.RTS and qb.state is QpState.RTS
    attr = qa.query()
    assert (attr.dest_qp, attr.sq_psn, attr.rq_psn) == (qb.num, 0x1234, 0xABCDEF)

    qb.post_recv(RecvWr(1, [b.mr.sge(1000, 64)]))
    a.buf[0:11] = b"over RC/UC!"
    qa.post_send(SendWr(2, WrType.SEND, [a.mr.sge(0, 11)]))
    a.buf[100:105] = b"write"
    qa.post_send(SendWr(3, WrType.RDMA_WRITE, [a.mr.sge(100, 5)],
                        remote_addr=b.mr.vaddr + 2000, rkey=b.mr.rkey))  # fmt: skip
    sent = a.cq.wait(WAIT, min_entries=2)
    got = b.cq.wait(WAIT)
    assert [(w.wr_id, w.status) for w in sent] == [(2, WcStatus.SUCCESS), (3, WcStatus.SUCCESS)]
    assert [(w.wr_id, w.wc_type, w.status, w.length) for w in got] == [
        (1, WcType.RECV, WcStatus.SUCCESS, 11)
    ]
    assert bytes(b.buf[1000:1011]) == b"over RC/UC!"
    assert bytes(b.buf[2000:2005]) == b"write"


def test_connect_qp_ud_gives_the_path_for_an_av(a: Node, b: Node) -> None:
    qa = a.pd.create_qp(QpCreate(QpType.UD, a.cq, a.cq))
    qb = b.pd.create_qp(QpCreate(QpType.UD, b.cq, b.cq))
    ea, eb = ibal.endpoint(qa, 1), ibal.endpoint(qb, 1, qkey=0x77)
    av = a.pd.create_av(ibal.connect_qp(qa, ea, eb))
    ibal.connect_qp(qb, eb, ea)
    assert qa.query().qkey == DEFAULT_QKEY and qb.query().qkey == 0x77
    qb.post_recv(RecvWr(5, [b.mr.sge(0, 40 + 64)]))
    a.buf[0:8] = b"datagram"
    qa.post_send(SendWr(6, WrType.SEND, [a.mr.sge(0, 8)], ud=eb.ud_dest(av)))
    (sent,) = a.cq.wait(WAIT)
    (recv,) = b.cq.wait(WAIT)
    assert sent.status is WcStatus.SUCCESS
    assert recv.status is WcStatus.SUCCESS and recv.src_qp == qa.num
    assert bytes(b.buf[40:48]) == b"datagram"
    assert not recv.recv_opt & RecvOpt.GRH_VALID and recv.network_header is None


def test_ud_receive_with_a_grh_says_ib_grh(a: Node, b: Node) -> None:
    qa = a.pd.create_qp(QpCreate(QpType.UD, a.cq, a.cq))
    qb = b.pd.create_qp(QpCreate(QpType.UD, b.cq, b.cq))
    ea, eb = ibal.endpoint(qa, 1), ibal.endpoint(qb, 1)
    av = a.pd.create_av(ibal.connect_qp(qa, ea, eb, options=ConnectOptions(grh=True)))
    ibal.connect_qp(qb, eb, ea)
    qb.post_recv(RecvWr(7, [b.mr.sge(0, 40 + 16)]))
    qa.post_send(SendWr(8, WrType.SEND, [a.mr.sge(0, 4)], ud=eb.ud_dest(av)))
    (recv,) = b.cq.wait(WAIT)
    assert recv.recv_opt & RecvOpt.GRH_VALID
    assert recv.network_header is NetworkHeader.IB_GRH
    assert eb.gid is not None and bytes(b.buf[24:40]) == eb.gid.packed  # the GRH's DGID


def test_connect_qp_refuses_what_it_cannot_do(a: Node, b: Node) -> None:
    qa = a.pd.create_qp(QpCreate(QpType.RC, a.cq, a.cq))
    qb = b.pd.create_qp(QpCreate(QpType.RC, b.cq, b.cq))
    eb = ibal.endpoint(qb, 1)
    with pytest.raises(InvalidPort):
        ibal.connect_qp(qa, 9, eb)
    with pytest.raises(InvalidParameter):
        ibal.connect_qp(qa, 1, "not an endpoint")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        ibal.connect_qp(qa, 1, Endpoint(qpn=eb.qpn))  # neither LID nor GID
    assert qa.state is QpState.RESET  # nothing was changed
    ibal.connect_qp(qa, 1, eb)
    with pytest.raises(InvalidQpState):
        ibal.connect_qp(qa, 1, eb)
    with pytest.raises(InvalidParameter):
        Endpoint(qpn=1 << 24)
    with pytest.raises(InvalidParameter):
        Endpoint.from_dict({"qpn": 1, "gid": "not a gid"})


def test_failed_step_returns_the_qp_to_reset(a: Node, b: Node) -> None:
    qa = a.pd.create_qp(QpCreate(QpType.RC, a.cq, a.cq))
    eb = ibal.endpoint(b.pd.create_qp(QpCreate(QpType.RC, b.cq, b.cq)), 1)
    with pytest.raises(ibal.IbError):
        ibal.connect_qp(qa, 1, eb, options=ConnectOptions(retry_cnt=99))  # RTS refuses it
    assert qa.state is QpState.RESET


# ------------------------------------------------------------ RoCE addressing


def roce_port() -> PortAttr:
    table = (
        GidEntry(0, IPv6Address("fe80::1"), GidType.ROCE_V1, "eth0"),
        GidEntry(1, IPv6Address("fe80::1"), GidType.ROCE_V2, "eth0"),
        GidEntry(2, IPv6Address("::ffff:10.0.0.1"), GidType.ROCE_V1, "eth0"),
        GidEntry(3, IPv6Address("::ffff:10.0.0.1"), GidType.ROCE_V2, "eth0"),
        GidEntry(5, IPv6Address("2001:db8::1"), GidType.ROCE_V2, "eth0"),
    )
    return PortAttr(
        port_num=1, port_guid=1, link_layer=LinkLayer.ETHERNET, active_mtu=Mtu.MTU_4096,
        gid_table=table,
    )  # fmt: skip


def test_roce_port_record_keeps_both_gid_views() -> None:
    port = roce_port()
    assert port.gids[4] == IPv6Address(0) and port.gids[5] == IPv6Address("2001:db8::1")
    assert port.gid_entry(4) is None and port.gid_entry(3) == port.gid_table[3]
    assert port.gid_table[3].network_header is NetworkHeader.IPV4
    assert port.gid_table[4].network_header is NetworkHeader.IPV6
    assert port.gid_table[0].network_header is NetworkHeader.IB_GRH
    # A provider that fills only ``gids`` gets entries derived from them.
    old = PortAttr(port_num=1, port_guid=1, gids=(IPv6Address("fe80::2"), IPv6Address(0)))
    assert old.gid_table == (GidEntry(0, IPv6Address("fe80::2"), GidType.IB),)


def test_roce_path_has_a_grh_from_the_matching_gid() -> None:
    port = roce_port()
    v4 = Endpoint(qpn=5, gid=IPv6Address("::ffff:10.0.0.2"), mtu=Mtu.MTU_1024)
    av = path_to(port, v4)
    assert av.dlid == 0 and av.grh is not None
    assert (av.grh.dgid, av.grh.sgid_index) == (v4.gid, 3)  # RoCE v2 over IPv4
    v6 = Endpoint(qpn=5, gid=IPv6Address("2001:db8::2"))
    assert path_to(port, v6).grh.sgid_index == 5  # type: ignore[union-attr]
    assert path_to(port, v4, ConnectOptions(sgid_index=2)).grh.sgid_index == 2  # type: ignore[union-attr]
    with pytest.raises(InvalidParameter):
        path_to(port, Endpoint(qpn=5, lid=3))  # RoCE needs the GID
    with pytest.raises(InvalidParameter):
        path_to(port, v4, ConnectOptions(sgid_index=4))  # a hole
    assert preferred_gid(port).index == 3
    assert preferred_gid(port, ipv4=False).index == 5
    rtr = transitions(QpType.RC, port, v4, psn=7)[1]
    assert rtr.path_mtu is Mtu.MTU_1024 and rtr.primary_av == av and rtr.rq_psn == 0


def test_ib_path_off_subnet_gets_a_grh() -> None:
    port = PortAttr(port_num=1, port_guid=2, lid=4, gids=(IPv6Address("fe80::2"),))
    near = Endpoint(qpn=1, lid=9, gid=IPv6Address("fe80::9"))
    far = Endpoint(qpn=1, lid=9, gid=IPv6Address("fec0:0:0:1::9"))
    assert path_to(port, near).grh is None
    grh = path_to(port, far).grh
    assert grh is not None and grh.sgid_index == 0 and grh.dgid == far.gid


# ------------------------------------------------------------------ cq.wait


def test_cq_wait_timeout_returns_nothing_and_does_not_spin(
    a: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = Cq.poll

    def counting(self: Cq, max_entries: int = 16) -> list:  # type: ignore[type-arg]
        calls.append(max_entries)
        return real(self, max_entries)

    monkeypatch.setattr(Cq, "poll", counting)
    assert a.cq.wait(0) == []
    assert a.cq.wait(0.2) == []
    assert len(calls) <= 4  # poll, (rearm) re-poll, and one after the deadline


def test_cq_wait_is_woken_by_the_completion(a: Node) -> None:
    qp = a.pd.create_qp(QpCreate(QpType.RC, a.cq, a.cq))
    # loopback to itself: its send PSN must be the one it expects (connect_qp draws one)
    ibal.connect_qp(qp, 1, ibal.endpoint(qp, 1, psn=0), psn=0)
    result: list[list] = []  # type: ignore[type-arg]
    started = threading.Event()

    def waiter() -> None:
        started.set()
        result.append(a.cq.wait(WAIT, min_entries=2))

    t = threading.Thread(target=waiter)
    t.start()
    started.wait(WAIT)
    qp.post_recv(RecvWr(1, [a.mr.sge(0, 16)]))
    qp.post_send(SendWr(2, WrType.SEND, [a.mr.sge(100, 4)]))
    t.join(WAIT)
    assert not t.is_alive()
    assert sorted((w.wr_id, w.status) for w in result[0]) == [
        (1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS),
    ]  # fmt: skip


def test_cq_wait_returns_inside_a_completion_callback(
    al: AccessLayer, a: Node, b: Node
) -> None:
    """A completion callback waits on CQs whose completions arrive later: the waits return."""
    from ibal.providers.mock.packets import PacketOp

    (provider,) = al.manager.providers
    # The SEND reaches b only after the waits began (the fabric's timer thread
    # delivers it), so only a wake-up from the provider's upcall can end them.
    provider.fabric.faults.delay(0.02, op=PacketOp.SEND)
    qa = a.pd.create_qp(QpCreate(QpType.RC, a.cq, a.cq))
    qb = b.pd.create_qp(QpCreate(QpType.RC, b.cq, b.cq))
    ea, eb = ibal.endpoint(qa, 1), ibal.endpoint(qb, 1)
    ibal.connect_qp(qa, ea, eb)
    ibal.connect_qp(qb, eb, ea)
    seen: list[tuple[int, WcStatus]] = []
    done = threading.Event()

    def comp_cb(cq: Cq, _context: object) -> None:
        cq.poll()
        qb.post_recv(RecvWr(7, [b.mr.sge(0, 16)]))
        qa.post_send(SendWr(8, WrType.SEND, [a.mr.sge(100, 4)]))
        seen.extend((w.wr_id, w.status) for w in b.cq.wait(WAIT))  # another CQ
        seen.extend((w.wr_id, w.status) for w in a.cq.wait(WAIT))
        done.set()

    trigger = a.ca.create_cq(8, comp_cb=comp_cb)
    tq = a.pd.create_qp(QpCreate(QpType.RC, trigger, trigger))
    et = ibal.endpoint(tq, 1)
    ibal.connect_qp(tq, et, et)  # loopback: its WRITE fires the callback
    trigger.rearm()
    tq.post_send(
        SendWr(1, WrType.RDMA_WRITE, [a.mr.sge(200, 4)], remote_addr=a.mr.vaddr + 300,
               rkey=a.mr.rkey)
    )
    assert done.wait(WAIT), "cq.wait inside a completion callback did not return"
    assert seen == [(7, WcStatus.SUCCESS), (8, WcStatus.SUCCESS)]


def test_cq_wait_checks_its_arguments(a: Node) -> None:
    with pytest.raises(InvalidParameter):
        a.cq.wait(-1)
    with pytest.raises(InvalidParameter):
        a.cq.wait(1, max_entries=1, min_entries=2)
    with pytest.raises(InvalidParameter):
        a.cq.wait(1, min_entries=0)


def test_cq_wait_on_a_destroyed_cq_raises(a: Node) -> None:
    cq = a.ca.create_cq(8)
    cq.destroy(wait=True)
    with pytest.raises(ibal.status.InvalidCqHandle):
        cq.wait(0)


# ------------------------------------------------------------------ look-ups


def test_gid_and_pkey_lookups(a: Node) -> None:
    port = a.ca.query_port(1)
    gid = port.gids[0]
    assert a.ca.find_gid(1, gid) == 0 and a.ca.find_gid(1, str(gid)) == 0
    entry = a.ca.gid_entry(1, 0)
    assert entry == GidEntry(0, gid, GidType.IB, "")
    assert entry.network_header is NetworkHeader.IB_GRH
    assert a.ca.find_pkey(1, 0xFFFF) == 0
    with pytest.raises(NotFound):
        a.ca.find_gid(1, "fe80::dead:beef")
    with pytest.raises(NotFound):
        a.ca.find_pkey(1, 0x8001)
    with pytest.raises(InvalidIndex):
        a.ca.gid_entry(1, 1)
    with pytest.raises(InvalidPort):
        a.ca.find_gid(7, gid)
    with pytest.raises(InvalidPkey):
        a.ca.find_pkey(1, 0x10000)
    with pytest.raises(InvalidPkey):
        a.ca.find_pkey(1, 0x8000)  # base key 0 is invalid
    with pytest.raises(InvalidParameter):
        a.ca.find_gid(1, "not a gid")
