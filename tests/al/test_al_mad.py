"""Alias QPs and MAD agents over the access layer's own QP1 (mock provider)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from ibal.al import AlManager, Ca, MadAgent, Pd, QpCreate
from ibal.ci.interface import Capabilities
from ibal.providers.mock import MockFabric, MockProvider
from ibal.status import (
    InvalidHandle,
    InvalidParameter,
    InvalidPort,
    InvalidQpHandle,
    InvalidSetting,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    MadAddr,
    MadRecv,
    MadSend,
    MadSendDone,
    PortAttr,
    QpType,
    WcStatus,
)

WAIT = 10.0
VENDOR = 0x09  # a vendor class: nobody else answers it
VENDOR2 = 0x0A
GET, SET, SEND, GET_RESP = 0x01, 0x02, 0x03, 0x81


def mad(mgmt_class: int, method: int, tid: int, payload: bytes = b"", version: int = 1) -> bytes:
    m = bytearray(MAD_SIZE)
    m[0], m[1], m[2], m[3] = 1, mgmt_class, version, method
    m[8:16] = tid.to_bytes(8, "big")
    m[16:18] = (0x10).to_bytes(2, "big")
    m[24 : 24 + len(payload)] = payload
    return bytes(m)


@dataclass
class Inbox:
    """What one agent heard, with a queue to wait on (no sleeps)."""

    recvs: queue.Queue[MadRecv] = field(default_factory=queue.Queue)
    dones: queue.Queue[MadSendDone] = field(default_factory=queue.Queue)

    def recv(self) -> MadRecv:
        return self.recvs.get(timeout=WAIT)

    def done(self) -> MadSendDone:
        return self.dones.get(timeout=WAIT)


@dataclass
class Side:
    ca: Ca
    pd: Pd
    port: PortAttr


@dataclass
class World:
    mgr: AlManager
    fabric: MockFabric
    a: Side
    b: Side

    def agent(self, side: Side, mgmt_class: int, methods: Any = (), alias: Any = None
              ) -> tuple[MadAgent, Inbox]:
        inbox = Inbox()
        if alias is None:
            alias = side.pd.get_spl_qp(side.port.port_guid, QpType.QP1_ALIAS)
        agent = alias.register_agent(
            mgmt_class, 1, methods=methods, recv_cb=inbox.recvs.put, send_cb=inbox.dones.put
        )
        return agent, inbox


@pytest.fixture
def world() -> Iterator[World]:
    fabric = MockFabric(seed=0)
    fabric.add_ca()
    fabric.add_ca()
    mgr = AlManager()
    mgr.add_provider(MockProvider({"fabric": fabric}))
    al = mgr.open_al()
    sides = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        sides.append(Side(ca, ca.alloc_pd(), ca.query().ports[0]))
    yield World(mgr, fabric, sides[0], sides[1])
    mgr.close(timeout=WAIT)
    fabric.close()


def to(side: Side, **kw: Any) -> MadAddr:
    return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=side.port.lid, **kw)


def qp1_of(world: World, side: Side) -> Any:
    """The mock's one QP1 on the side's port (``None`` when nobody holds it)."""
    ca = next(c for c in world.fabric.cas if c.guid == side.ca.guid)
    return ca.ports[0].special[1]


def test_two_aliases_share_the_one_qp1(world: World) -> None:
    a = world.a
    x = a.pd.get_spl_qp(a.port.port_guid, QpType.QP1_ALIAS)
    qp1 = qp1_of(world, a)
    assert qp1 is not None
    y = a.pd.get_spl_qp(a.port.port_guid, QpType.QP1_ALIAS)
    assert qp1_of(world, a) is qp1 and x.num == y.num == 1 and x.port_num == a.port.port_num
    cq = a.ca.create_cq(4)
    with pytest.raises(ResourceBusy):  # the AL holds QP1 for its aliases
        a.pd.get_spl_qp(a.port.port_guid, QpCreate(QpType.QP1, cq, cq))
    x.destroy(wait=True)
    assert qp1_of(world, a) is qp1
    y.destroy(wait=True)
    assert qp1_of(world, a) is None  # freed with its last user
    direct = a.pd.get_spl_qp(a.port.port_guid, QpCreate(QpType.QP1, cq, cq))
    assert direct.num == 1
    with pytest.raises(ResourceBusy):  # and the other way round
        a.pd.get_spl_qp(a.port.port_guid, QpType.QP1_ALIAS)


def test_a_mad_between_two_cas_lands_byte_exact(world: World) -> None:
    sender, s_in = world.agent(world.a, VENDOR)
    _receiver, r_in = world.agent(world.b, VENDOR, methods={GET})
    assert sender.hi_tid is not None
    req = mad(VENDOR, GET, (sender.hi_tid << 32) | 0x1234, b"\x01\x02hello\xff" * 20)
    sender.send(MadSend(req, to(world.b), context="req"))
    got = r_in.recv()
    assert got.mad == req
    assert (got.port_num, got.qp_num) == (world.b.port.port_num, 1)
    assert got.addr.dlid == world.a.port.lid and got.addr.remote_qp == 1
    assert s_in.done() == MadSendDone("req", WcStatus.SUCCESS)


def test_requests_route_by_class_and_method_unclaimed_are_counted(world: World) -> None:
    sender, _ = world.agent(world.a, VENDOR)
    alias_b = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
    _get_agent, get_in = world.agent(world.b, VENDOR, methods={GET}, alias=alias_b)
    _other, other_in = world.agent(world.b, VENDOR2, methods={GET, SET})
    _set_agent, set_in = world.agent(world.b, VENDOR, methods={SET})
    for cls, method, low in ((VENDOR2, SET, 1), (VENDOR, GET, 2), (VENDOR, SET, 3),
                             (0x0B, GET, 4), (VENDOR, 0x03, 5)):
        sender.send(MadSend(mad(cls, method, low), to(world.b)))
    assert int.from_bytes(other_in.recv().mad[12:16], "big") == 1
    assert int.from_bytes(get_in.recv().mad[12:16], "big") == 2
    assert int.from_bytes(set_in.recv().mad[12:16], "big") == 3
    # A probe after the unclaimed ones: once it is in, the two before it were handled.
    sender.send(MadSend(mad(VENDOR, GET, 6), to(world.b)))
    assert int.from_bytes(get_in.recv().mad[12:16], "big") == 6
    # The unserved Get of class 0x0B is answered (bad version); the Send just dropped.
    assert alias_b.transport_stats == {"answered_0x0004": 1, "dropped_unclaimed": 1}
    assert get_in.recvs.empty() and set_in.recvs.empty() and other_in.recvs.empty()


def test_responses_route_by_tid_to_the_agent_that_asked(world: World) -> None:
    alias_a = world.a.pd.get_spl_qp(world.a.port.port_guid, QpType.QP1_ALIAS)
    one, one_in = world.agent(world.a, VENDOR, alias=alias_a)
    two, two_in = world.agent(world.a, VENDOR, alias=alias_a)
    server, server_in = world.agent(world.b, VENDOR, methods={GET})
    one.send(MadSend(mad(VENDOR, GET, 7), to(world.b), timeout_ms=60_000, context=1))
    two.send(MadSend(mad(VENDOR, GET, 7), to(world.b), timeout_ms=60_000, context=2))
    for _ in range(2):
        req = server_in.recv()
        resp = bytearray(req.mad)
        resp[3] = GET_RESP
        resp[24:28] = req.mad[8:12]  # echo which agent asked, for the check below
        server.send(MadSend(bytes(resp), req.addr))
    for agent, inbox, ctx in ((one, one_in, 1), (two, two_in, 2)):
        got = inbox.recv()
        assert got.mad[3] == GET_RESP
        assert int.from_bytes(got.mad[8:12], "big") == agent.hi_tid
        assert got.mad[24:28] == got.mad[8:12]
        assert inbox.done() == MadSendDone(ctx, WcStatus.SUCCESS)
    assert one.hi_tid != two.hi_tid
    # A response nobody waits for (no timeout) is dropped like the kernel drops it.
    stray = bytearray(mad(VENDOR, GET_RESP, (one.hi_tid or 0) << 32 | 99))
    server.send(MadSend(bytes(stray), to(world.a)))
    one.send(MadSend(mad(VENDOR, GET, 8), to(world.b), timeout_ms=60_000))
    req = server_in.recv()
    server.send(MadSend(bytes([*req.mad[:3], GET_RESP, *req.mad[4:]]), req.addr))
    assert int.from_bytes(one_in.recv().mad[12:16], "big") == 8
    assert alias_a.transport_stats == {"dropped_unmatched_response": 1}


def test_the_send_completion_comes_before_its_response(world: World) -> None:
    """IBAL's order (access-layer rule 79): the request's send_cb, then the response."""
    events: queue.Queue[object] = queue.Queue()
    alias = world.a.pd.get_spl_qp(world.a.port.port_guid, QpType.QP1_ALIAS)
    asker = alias.register_agent(VENDOR, 1, recv_cb=events.put, send_cb=events.put)
    server, server_in = world.agent(world.b, VENDOR, methods={GET})
    asker.send(MadSend(mad(VENDOR, GET, 9), to(world.b), timeout_ms=60_000, context="q"))
    req = server_in.recv()
    server.send(MadSend(bytes([*req.mad[:3], GET_RESP, *req.mad[4:]]), req.addr))
    assert events.get(timeout=WAIT) == MadSendDone("q", WcStatus.SUCCESS)
    answer = events.get(timeout=WAIT)
    assert isinstance(answer, MadRecv) and answer.mad[3] == GET_RESP


def test_an_unanswered_request_times_out_after_its_retries(world: World) -> None:
    asker, inbox = world.agent(world.a, VENDOR)
    listener = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
    asker.send(MadSend(mad(0x0B, SEND, 1), to(world.b), timeout_ms=20, retries=2, context="q"))
    assert inbox.done() == MadSendDone("q", WcStatus.TIMEOUT_RETRY_ERR)
    assert listener.transport_stats == {"dropped_unclaimed": 3}  # the first try and 2 retries


def test_response_timeouts_follow_the_managers_clock() -> None:
    """Retries go out exactly when a ManualClock is stepped past each time-out, not before."""
    from ibal.clock import ManualClock

    clock = ManualClock()
    fabric = MockFabric(seed=0)
    fabric.add_ca()
    fabric.add_ca()
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al = mgr.open_al()
        a, b = (al.open_ca(g) for g in al.get_ca_guids())
        pa, pb = a.alloc_pd(), b.alloc_pd()
        inbox = Inbox()
        asker = pa.get_spl_qp(a.query().ports[0].port_guid, QpType.QP1_ALIAS).register_agent(
            VENDOR, 1, methods=(), recv_cb=inbox.recvs.put, send_cb=inbox.dones.put
        )
        listener = pb.get_spl_qp(b.query().ports[0].port_guid, QpType.QP1_ALIAS)
        dest = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=b.query().ports[0].lid)
        asker.send(MadSend(mad(0x0B, SEND, 1), dest, timeout_ms=100, retries=1, context="q"))
        mgr.queues.flush()
        assert listener.transport_stats == {"dropped_unclaimed": 1}
        clock.advance(0.099, settle=mgr.queues.flush)
        assert listener.transport_stats == {"dropped_unclaimed": 1}  # not yet
        assert inbox.dones.empty()
        clock.advance(0.002, settle=mgr.queues.flush)
        assert listener.transport_stats == {"dropped_unclaimed": 2}  # the one retry
        assert inbox.dones.empty()
        clock.advance(0.1, settle=mgr.queues.flush)
        assert inbox.done() == MadSendDone("q", WcStatus.TIMEOUT_RETRY_ERR)
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def test_destroying_one_alias_leaves_the_other_working(world: World) -> None:
    alias_x = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
    world.agent(world.b, VENDOR2, methods={GET}, alias=alias_x)
    _keep, keep_in = world.agent(world.b, VENDOR, methods={GET})
    sender, _ = world.agent(world.a, VENDOR)
    alias_x.destroy(wait=True)
    sender.send(MadSend(mad(VENDOR, GET, 1), to(world.b)))
    assert int.from_bytes(keep_in.recv().mad[12:16], "big") == 1
    # The class the destroyed alias served is free again.
    _again, again_in = world.agent(world.b, VENDOR2, methods={GET})
    sender.send(MadSend(mad(VENDOR2, GET, 2), to(world.b)))
    assert int.from_bytes(again_in.recv().mad[12:16], "big") == 2
    with pytest.raises(InvalidQpHandle):
        alias_x.register_agent(VENDOR, 1, recv_cb=print)


def test_deregister_cancels_pending_sends_before_the_destroy_callback(world: World) -> None:
    order: list[object] = []
    done = threading.Event()
    alias = world.a.pd.get_spl_qp(world.a.port.port_guid, QpType.QP1_ALIAS)
    asker = alias.register_agent(VENDOR, 1, recv_cb=print, send_cb=order.append)
    asker.send(MadSend(mad(VENDOR, GET, 1), to(world.b), timeout_ms=600_000, context="p"))
    asker.deregister(lambda _ctx: (order.append("destroyed"), done.set()))
    assert done.wait(WAIT)
    assert order == [MadSendDone("p", WcStatus.CANCELED), "destroyed"]
    with pytest.raises(InvalidHandle):
        asker.send(MadSend(mad(VENDOR, GET, 2), to(world.b)))


def test_ca_removal_tears_every_alias_and_agent_down(world: World) -> None:
    asker, inbox = world.agent(world.a, VENDOR)
    alias = asker.alias
    asker.send(MadSend(mad(VENDOR, GET, 1), to(world.b), timeout_ms=600_000, context="p"))
    ca = next(c for c in world.fabric.cas if c.guid == world.a.ca.guid)
    world.fabric.hotplug_remove(ca)  # the mock's close_ca refuses if anything is left
    assert inbox.done() == MadSendDone("p", WcStatus.CANCELED)
    with pytest.raises(InvalidQpHandle):
        alias.register_agent(VENDOR, 1, recv_cb=print)
    with pytest.raises(InvalidHandle):
        asker.send(MadSend(mad(VENDOR, GET, 2), to(world.b)))


def test_pd_dealloc_destroys_its_aliases(world: World) -> None:
    a = world.a
    pd = a.ca.alloc_pd()
    alias = pd.get_spl_qp(a.port.port_guid, QpType.QP1_ALIAS)
    agent, _ = world.agent(a, VENDOR, alias=alias)
    pd.dealloc(wait=True)
    assert qp1_of(world, a) is None
    with pytest.raises(InvalidHandle):
        agent.send(MadSend(mad(VENDOR, GET, 1), to(world.b)))


def test_bad_input_raises_the_matching_status(world: World) -> None:
    a = world.a
    with pytest.raises(InvalidPort):
        a.pd.get_spl_qp(0xBAD, QpType.QP1_ALIAS)
    with pytest.raises(InvalidSetting):
        a.pd.get_spl_qp(a.port.port_guid, QpType.UD)
    cq = a.ca.create_cq(4)
    with pytest.raises(InvalidSetting):
        a.pd.get_spl_qp(a.port.port_guid, QpCreate(QpType.QP1_ALIAS, cq, cq))
    agent, _ = world.agent(a, VENDOR, methods={GET})
    alias = agent.alias
    with pytest.raises(ResourceBusy):
        alias.register_agent(VENDOR, 1, methods={GET}, recv_cb=print)
    with pytest.raises(InvalidParameter):
        alias.register_agent(VENDOR, 1, methods={GET_RESP}, recv_cb=print)
    with pytest.raises(InvalidParameter):
        alias.register_agent(0x100, 1, recv_cb=print)
    with pytest.raises(InvalidParameter):
        alias.register_agent(VENDOR, 1, recv_cb="nope")  # type: ignore[arg-type]
    good = MadSend(mad(VENDOR, GET, 1), to(world.b))
    for bad in (
        replace(good, mad=good.mad[:100]),
        replace(good, mad=good.mad + b"\0"),
        replace(good, addr=replace(good.addr, dlid=0x10000)),
        replace(good, addr=replace(good.addr, remote_qp=-1)),
        replace(good, timeout_ms=-5),
        "not a MadSend",
    ):
        with pytest.raises(InvalidParameter):
            agent.send(bad)  # type: ignore[arg-type]
    agent.deregister(wait=True)
    with pytest.raises(InvalidHandle):
        agent.send(good)


def test_short_or_bad_mads_on_the_wire_are_dropped_and_counted(world: World) -> None:
    """A peer's malformed MADs (bad base version, short datagram) never reach an agent."""
    from ibal.al import QpCreate as Create
    from ibal.types import AccessFlags, AvAttr, DgrmInfo, SendWr, UdDest

    listener, inbox = world.agent(world.b, VENDOR, methods={GET})
    b_alias = listener.alias
    a = world.a
    cq = a.ca.create_cq(8)
    ud = a.pd.create_qp(Create(QpType.UD, cq, cq))
    # The Q_Key's high bit means "use the QP's own", so the QP holds the GSI one.
    ud.init_dgrm_svc(DgrmInfo(port_guid=a.port.port_guid, qkey=QP1_WELL_KNOWN_QKEY))
    buf = bytearray(mad(VENDOR, GET, 1))
    buf[0] = 2  # base version 2
    mr = a.pd.reg_mem(buf, AccessFlags.LOCAL_WRITE)
    av = a.pd.create_av(AvAttr(a.port.port_num, dlid=world.b.port.lid))
    dest = UdDest(av=av, remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY)
    ud.post_send(SendWr(wr_id=1, sg_list=[mr.sge(0, MAD_SIZE)], ud=dest))
    ud.post_send(SendWr(wr_id=2, sg_list=[mr.sge(0, 100)], ud=dest))
    buf[0] = 1
    ud.post_send(SendWr(wr_id=3, sg_list=[mr.sge(0, MAD_SIZE)], ud=dest))
    assert inbox.recv().mad == bytes(buf)
    assert b_alias.transport_stats == {"dropped_bad_version": 1, "dropped_short": 1}


def test_no_mad_transport_without_special_qps_or_agents(world: World) -> None:
    """A CA that declares neither says so (here: the capability check itself)."""
    from ibal.al import mad_port

    class Cica:
        capabilities = Capabilities(special_qps=frozenset())
        name = "none"

    with pytest.raises(Unsupported):
        mad_port.transport_kind(Cica(), 1)  # type: ignore[arg-type]


def test_contract_versions_one_and_two_are_accepted_others_refused() -> None:
    from al_fakes import FakeCi

    from ibal.types import MIN_VERBS_VERSION, VERBS_VERSION

    assert (MIN_VERBS_VERSION, VERBS_VERSION) == (1, 2)
    with AlManager() as m:
        old = FakeCi(0x71)
        old.version = 1  # written before MAD agents: still works, never asked for them
        m.register_ca(old)
        for bad in (0, 3, "2"):
            ci = FakeCi(0x72)
            ci.version = bad  # type: ignore[assignment]
            with pytest.raises(Unsupported):
                m.register_ca(ci)
            assert ci.verbs() == []


def test_the_sender_of_a_roce_v2_ipv4_datagram_is_its_mapped_gid() -> None:
    """The GRH area of a RoCE v2 IPv4 receive holds the IPv4 header in its last 20 bytes."""
    import ipaddress

    from ibal.al.mad_port import sender_grh
    from ibal.types import Gid, NetworkHeader

    ip = bytearray(20)
    ip[0], ip[1], ip[8], ip[9] = 0x45, 0x28, 63, 17  # version/IHL, TOS, TTL, UDP
    ip[12:16] = ipaddress.IPv4Address("10.99.0.2").packed
    ip[16:20] = ipaddress.IPv4Address("10.99.0.1").packed
    grh = sender_grh(bytes(20) + bytes(ip), NetworkHeader.IPV4)
    assert grh.dgid == Gid("::ffff:10.99.0.2")
    assert (grh.hop_limit, grh.traffic_class) == (63, 0x28)
    ib = bytearray(40)
    ib[0:4] = ((6 << 28) | (0x12 << 20) | 0xABCDE).to_bytes(4, "big")
    ib[7] = 9
    ib[8:24] = Gid("fe80::1").packed
    grh = sender_grh(bytes(ib), NetworkHeader.IB_GRH)
    assert (grh.dgid, grh.flow_label, grh.traffic_class, grh.hop_limit) == (
        Gid("fe80::1"), 0xABCDE, 0x12, 9)


def test_an_smp_no_agent_serves_is_answered_by_the_cas_sma(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IBA 14.2: every CA port has an SMA.  An SMP (LID-routed or directed route) that
    reaches the AL's QP0 with no agent for it goes to the provider's local MAD processing
    and its answer goes back; never a "class not supported" status.  (The mock's engine
    answers SMPs before they reach a QP0, so this feeds the transport as its receive
    path would.)"""
    from ibal.al import mad_port
    from ibal.wire.mad import header
    from ibal.wire.mad.consts import Method, MgmtClass, SmpAttr

    a, b = world.a, world.b
    a.pd.get_spl_qp(a.port.port_guid, QpType.QP0_ALIAS)
    b_alias = b.pd.get_spl_qp(b.port.port_guid, QpType.QP0_ALIAS)
    t = mad_port.lookup(a.ca._cica, a.port.port_num, 0)
    assert isinstance(t, mad_port.SplQpTransport)
    back = MadAddr(remote_qp=0, remote_qkey=0, dlid=b.port.lid)
    lid_routed = header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.NODE_INFO, tid=7)
    directed = header.build(MgmtClass.SUBN_DR, Method.GET, SmpAttr.NODE_INFO, tid=8,
                            dr_path=[])  # fmt: skip
    for smp in (lid_routed, directed):
        t._route(MadRecv(bytes(smp), back, a.port.port_num, 0))
    assert t.stats == {"answered_by_sma": 2}
    # The answers went to B's QP0 as responses nobody waits for.
    from ibal.testing.helpers import wait_until

    wait_until(lambda: b_alias.transport_stats == {"dropped_unmatched_response": 2},
               "both answers at B")  # fmt: skip
    # A provider without a local MAD path: dropped and counted, not answered.
    monkeypatch.setattr(a.ca._cica.ci, "local_mad",
                        lambda *_: (_ for _ in ()).throw(Unsupported("no SMA")))  # fmt: skip
    t._route(MadRecv(bytes(directed), back, a.port.port_num, 0))
    assert t.stats == {"answered_by_sma": 2, "dropped_unserved_smp": 1}


def test_inline_callbacks_run_on_the_providers_thread_default_ones_on_the_misc_queue(
    world: World,
) -> None:
    from ibal.al.dispatcher import current_queue

    heard: queue.Queue[tuple[str, object, bytes]] = queue.Queue()
    a_alias = world.a.pd.get_spl_qp(world.a.port.port_guid, QpType.QP1_ALIAS)
    b_alias = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
    fast = a_alias.register_agent(
        VENDOR, 1, inline=True,
        recv_cb=lambda r: heard.put(("recv", current_queue(), r.mad)),
        send_cb=lambda d: heard.put(("done", current_queue(), d.context)),
    )  # fmt: skip
    queued = b_alias.register_agent(
        VENDOR, 1, methods={GET}, recv_cb=lambda r: heard.put(("served", current_queue(), r.mad))
    )
    assert fast.hi_tid is not None
    req = mad(VENDOR, GET, (fast.hi_tid << 32) | 7, b"inline")
    fast.send(MadSend(req, to(world.b), timeout_ms=60_000, context="q"))
    kind, where, got = heard.get(timeout=WAIT)
    assert (kind, where, got) == ("served", world.mgr.queues.misc, req)
    queued.send(MadSend(bytes([*req[:3], GET_RESP, *req[4:]]), to(world.a)))
    # the AL's own QP1 transport hears its CQ on the completion queue: inline is there
    inline_at = world.mgr.queues.completion
    assert heard.get(timeout=WAIT) == ("done", inline_at, "q")
    kind, where, got = heard.get(timeout=WAIT)
    assert (kind, where, got[3], got[24:30]) == ("recv", inline_at, GET_RESP, b"inline")


def test_an_inline_callback_may_deregister_its_agent_the_cleanup_runs_on_teardown(
    world: World,
) -> None:
    from ibal.al.dispatcher import current_queue

    gone = threading.Event()
    where: list[object] = []
    alias = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
    box: list[MadAgent] = []

    def recv(r: MadRecv) -> None:
        box[0].deregister(lambda _ctx: (where.append(current_queue()), gone.set()))
        where.append(r.mad[12:16])

    box.append(alias.register_agent(VENDOR, 1, methods={GET}, inline=True, recv_cb=recv))
    sender, _ = world.agent(world.a, VENDOR)
    sender.send(MadSend(mad(VENDOR, GET, 5), to(world.b)))
    assert gone.wait(WAIT)
    assert where == [(5).to_bytes(4, "big"), world.mgr.queues.teardown]
    with pytest.raises(InvalidHandle):
        box[0].send(MadSend(mad(VENDOR, GET, 6), to(world.a)))
    # the class is free again
    _again, again_in = world.agent(world.b, VENDOR, methods={GET})
    sender.send(MadSend(mad(VENDOR, GET, 7), to(world.b)))
    assert int.from_bytes(again_in.recv().mad[12:16], "big") == 7


def test_send_many_queues_each_and_batches_reach_recv_batch_cb(world: World) -> None:
    """``MadAgent.send_many`` (the AL's loop over the special QP here): each MAD lands once,
    each send completes once; a batch with a malformed MAD sends none; an inline agent's
    ``recv_batch_cb`` gets sequences of MADs in place of ``recv_cb``."""
    batches: queue.Queue[list[bytes]] = queue.Queue()
    alias = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
    with pytest.raises(InvalidParameter):  # batches only for inline agents
        alias.register_agent(VENDOR, 1, methods={GET}, recv_cb=print, recv_batch_cb=print)
    alias.register_agent(
        VENDOR, 1, methods={GET}, inline=True, recv_cb=print,
        recv_batch_cb=lambda rs: batches.put([bytes(r.mad) for r in rs]),
    )  # fmt: skip
    sender, inbox = world.agent(world.a, VENDOR)
    refused = [MadSend(mad(VENDOR, GET, 0x200 + i), to(world.b)) for i in range(3)]
    refused[1] = replace(refused[1], addr=replace(refused[1].addr, sl=16))
    with pytest.raises(InvalidParameter):
        sender.send_many(refused)
    sends = [MadSend(mad(VENDOR, GET, 0x100 + i), to(world.b), context=i) for i in range(5)]
    assert sender.send_many(sends) == 5
    assert sender.send_many([]) == 0
    got: list[bytes] = []
    while len(got) < 5:
        batch = batches.get(timeout=WAIT)
        assert batch, "an empty batch"
        got += batch
    assert sorted(int.from_bytes(m[12:16], "big") for m in got) == list(range(0x100, 0x105))
    assert sorted(inbox.done().context for _ in sends) == list(range(5))
    assert batches.empty() and inbox.dones.empty()


class _StubCi:
    """Just the MAD-agent send verbs, recording what they were given."""

    def __init__(self, many: int | Exception | None) -> None:
        self.many = many
        self.calls: list[tuple[str, int]] = []

    def send_mad(self, key: Any, send: MadSend) -> None:
        self.calls.append(("one", int.from_bytes(send.mad[12:16], "big")))
        if len(self.calls) == 2 and isinstance(self.many, Exception):
            raise self.many


class _StubManyCi(_StubCi):
    def send_mad_many(self, key: Any, sends: list[MadSend]) -> int:
        self.calls.append(("many", len(sends)))
        if isinstance(self.many, Exception):
            raise self.many
        assert self.many is not None
        return self.many


def test_agent_transport_takes_send_mad_many_where_offered_else_loops() -> None:
    """The provider's ``send_mad_many`` is called once per batch and its count passed on;
    without it the AL loops over ``send_mad``, stopping at the first failure, which
    raises only when nothing was sent."""
    from ibal.al.mad_port import AgentTransport
    from ibal.status import InsufficientResources

    sends = [MadSend(mad(VENDOR, GET, i), MadAddr(dlid=1)) for i in range(3)]

    def transport(ci: object) -> AgentTransport:
        return AgentTransport(type("Cica", (), {"ci": ci})(), 1, 1)

    ci = _StubManyCi(3)
    assert transport(ci).send_many("k", sends) == 3 and ci.calls == [("many", 3)]
    ci = _StubManyCi(2)  # the port took two: the caller sends the rest again
    assert transport(ci).send_many("k", sends) == 2
    ci = _StubManyCi(InsufficientResources("full"))
    with pytest.raises(InsufficientResources):
        transport(ci).send_many("k", sends)
    loop = _StubCi(None)
    assert transport(loop).send_many("k", sends) == 3
    assert loop.calls == [("one", 0), ("one", 1), ("one", 2)]
    loop = _StubCi(InsufficientResources("full"))  # the second send fails
    assert transport(loop).send_many("k", sends) == 1


def test_a_burst_beyond_the_send_queue_waits_for_slots_and_all_lands(world: World) -> None:
    """More MADs at once than the QP1 send queue holds (a CM burst of DREQs) while send
    completions lag (as hardware's do: the mock's ``lag_sends`` fault): the rest wait in
    order behind the sends in flight, none fails, each lands and completes once when the
    completions come."""
    alias = world.a.pd.get_spl_qp(world.a.port.port_guid, QpType.QP1_ALIAS)
    sender = alias.register_agent(VENDOR, 1, recv_cb=print, send_cb=(dones := Inbox()).dones.put)
    _receiver, r_in = world.agent(world.b, VENDOR, methods={SEND})
    world.fabric.manual_clock()
    lag = world.fabric.faults.lag_sends(1.0, src_qp=1)
    n = 300
    for i in range(n):
        sender.send(MadSend(mad(VENDOR, SEND, 0x1000 + i), to(world.b), context=i))
    assert alias.transport_stats["sends_queued"] == n - 64  # the send queue's depth
    assert lag.fired == 64 and dones.dones.empty()  # on the wire, not completed
    got = [int.from_bytes(r_in.recv().mad[12:16], "big") for _ in range(64)]
    assert got == [0x1000 + i for i in range(64)]
    assert r_in.recvs.empty()  # the rest wait for slots
    world.fabric.advance(0.5)
    assert dones.dones.empty()  # not yet
    world.fabric.advance(0.5)  # the first 64 complete, in order; each freed slot takes the
    assert [dones.done().context for _ in range(64)] == list(range(64))  # next send ...
    got = [int.from_bytes(r_in.recv().mad[12:16], "big") for _ in range(64)]
    assert got == [0x1000 + i for i in range(64, 128)]  # ... which lags in turn
    assert lag.fired == 128 and dones.dones.empty()
    lag.remove()
    world.fabric.advance(1.0)  # those complete; the other 172 go out and complete at once
    assert sorted(dones.done().context for _ in range(n - 64)) == list(range(64, n))
    got = [int.from_bytes(r_in.recv().mad[12:16], "big") for _ in range(n - 128)]
    assert got == [0x1000 + i for i in range(128, n)]  # every one, in the order sent
    assert dones.dones.empty() and r_in.recvs.empty()


def test_mad_sends_share_one_address_handle_per_destination() -> None:
    """The QP1 transport's address-handle cache: one handle per destination while sends to
    it are in flight or it is among the recently used; idle ones beyond the size go, least
    recently used first; one in use never does; ``clear`` hands every handle back."""
    from ibal.al.mad_sends import AvCache as _AvCache

    made: list[int] = []

    def create() -> int:
        made.append(len(made))
        return made[-1]

    cache = _AvCache(size=2)
    keys = [(lid, 0, None, 0) for lid in (1, 2, 3)]
    assert cache.take(keys[0], create) == 0 and cache.take(keys[0], create) == 0
    assert made == [0]  # the second send to LID 1 reused the handle
    assert cache.take(keys[1], create) == 1 and cache.take(keys[2], create) == 2
    assert cache.release(keys[0]) == []  # over size, but every handle is in use
    assert cache.release(keys[0]) == [0]  # LID 1 idle and least recently used: evicted
    assert cache.release(keys[1]) == []  # back within size
    assert sorted(cache.clear()) == [1, 2] and cache.clear() == []


def test_an_answer_that_came_another_way_does_not_end_the_request(world: World) -> None:
    """As Linux's MAD layer matches: the right TID with a GRH, to a request sent without
    one, is not its answer (dropped and counted); the request waits on and takes the
    answer that comes the way it went."""
    from ibal.types import Gid, Grh

    asker, a_in = world.agent(world.a, VENDOR)
    server, s_in = world.agent(world.b, VENDOR, methods={GET})
    asker.send(MadSend(mad(VENDOR, GET, 0x51), to(world.b), timeout_ms=60_000, context="q"))
    req = s_in.recv()
    assert req.addr.grh is None
    answer = bytes([*req.mad[:3], GET_RESP, *req.mad[4:]])
    gid = Gid(world.a.port.gids[0].packed if world.a.port.gids else bytes(16))
    server.send(MadSend(answer, replace(req.addr, grh=Grh(gid))))
    server.send(MadSend(answer, req.addr))
    got = a_in.recv()
    assert got.mad == answer and got.addr.grh is None
    assert a_in.done() == MadSendDone("q", WcStatus.SUCCESS)
    assert a_in.recvs.empty()
    alias_a = world.a.pd.get_spl_qp(world.a.port.port_guid, QpType.QP1_ALIAS)
    assert alias_a.transport_stats == {"dropped_wrong_source": 1}


def _spy_posts(monkeypatch: pytest.MonkeyPatch, side: Side, h_qp: Any,
               fail_at: int | None = None) -> list[tuple[str, int]]:  # fmt: skip
    """The side's ``post_send``/``post_recv`` calls on ``h_qp``: (verb, WRs); ``fail_at``:
    ``post_send`` refuses its WR of that index (the ones before it are sent)."""
    from ibal.status import Status, post_error

    ci = side.ca._cica.ci
    calls: list[tuple[str, int]] = []
    send, recv = ci.post_send, ci.post_recv

    def post_send(h: Any, wrs: Any) -> None:
        if h is h_qp:
            calls.append(("send", len(wrs)))
            if fail_at is not None and len(wrs) > fail_at:
                send(h, wrs[:fail_at])
                raise post_error(Status.INSUFFICIENT_RESOURCES, fail_at, "refused")
        send(h, wrs)

    def post_recv(h: Any, wrs: Any) -> None:
        if h is h_qp:
            calls.append(("recv", len(wrs)))
        recv(h, wrs)

    monkeypatch.setattr(ci, "post_send", post_send)
    monkeypatch.setattr(ci, "post_recv", post_recv)
    return calls


class _Answerer:
    """B's inline agent for VENDOR GETs, answering each with a GetResp from its callback."""

    def __init__(self, world: World) -> None:
        alias = world.b.pd.get_spl_qp(world.b.port.port_guid, QpType.QP1_ALIAS)
        self.agent = alias.register_agent(VENDOR, 1, methods={GET}, inline=True,
                                          recv_cb=self.answer)  # fmt: skip
        self.transport: Any = alias._transport
        self.failed: queue.Queue[Exception] = queue.Queue()
        self.on_recv: Any = None

    def answer(self, r: MadRecv) -> None:
        if self.on_recv is not None:
            self.on_recv()
        try:
            self.agent.send(MadSend(bytes([*r.mad[:3], GET_RESP, *r.mad[4:]]), r.addr))
        except Exception as exc:
            self.failed.put(exc)


def test_the_answers_to_a_receive_batch_leave_with_one_post_send(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What agents send on the thread that drains a receive batch (an inline agent's
    answers, the transport's own reply to an unserved request) leaves after the batch
    with one ``post_send`` of all of them; the batch's receive slots go back with one
    ``post_recv`` before its first MAD is handled (a burst beyond the batch finds
    receives posted); every answer lands and ends its request."""
    answerer = _Answerer(world)
    t = answerer.transport
    sender, inbox = world.agent(world.a, VENDOR)
    calls = _spy_posts(monkeypatch, world.b, t._h_qp)
    seen: list[list[tuple[str, int]]] = []
    answerer.on_recv = lambda: seen.append(list(calls))
    gate = threading.Event()
    world.mgr.queues.completion.post(gate.wait)  # the receive batch waits on B
    reqs = [MadSend(mad(VENDOR, GET, (sender.hi_tid << 32) | (0x100 + i)), to(world.b),
                    timeout_ms=60_000, context=i) for i in range(10)]  # fmt: skip
    assert sender.send_many(reqs) == 10
    other, other_in = world.agent(world.a, VENDOR2)  # a class B does not serve: answered
    other.send(MadSend(mad(VENDOR2, GET, (other.hi_tid << 32) | 9), to(world.b),
                       timeout_ms=60_000, context="unserved"))  # fmt: skip
    assert world.b.ca._cica.ci.peek_cq(t._h_cq) == 11  # all wait in one batch
    gate.set()
    got = sorted(int.from_bytes(inbox.recv().mad[12:16], "big") for _ in range(10))
    assert got == list(range(0x100, 0x10A))
    assert sorted(inbox.done().context for _ in range(10)) == list(range(10))
    bad = other_in.recv().mad
    assert bad[3] == GET_RESP and int.from_bytes(bad[4:6], "big") != 0  # a status, not data
    assert calls == [("recv", 11), ("send", 11)]
    assert seen[0] == [("recv", 11)]  # the slots were back before the first MAD was handled


def test_a_batch_the_provider_refuses_part_of_loses_only_that_part(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider takes the first 3 answers of a batch of 10 and refuses the 4th: those
    3 land, the other 7 are counted ``send_failed`` (nothing raises into the agent), their
    slots are free again and the next batch goes out whole."""
    answerer = _Answerer(world)
    t = answerer.transport
    sender, inbox = world.agent(world.a, VENDOR)
    calls = _spy_posts(monkeypatch, world.b, t._h_qp, fail_at=3)
    gate = threading.Event()
    world.mgr.queues.completion.post(gate.wait)
    hi = sender.hi_tid << 32
    assert sender.send_many([MadSend(mad(VENDOR, GET, hi | (0x100 + i)), to(world.b),
                                     timeout_ms=60_000) for i in range(10)]) == 10  # fmt: skip
    gate.set()
    got = [int.from_bytes(inbox.recv().mad[12:16], "big") for _ in range(3)]
    assert got == [0x100, 0x101, 0x102]
    sender.send(MadSend(mad(VENDOR, GET, hi | 0x200), to(world.b), timeout_ms=60_000))
    assert int.from_bytes(inbox.recv().mad[12:16], "big") == 0x200
    assert inbox.recvs.empty() and answerer.failed.empty()
    assert t.stats["send_failed"] == 7
    assert calls == [("recv", 10), ("send", 10), ("recv", 1), ("send", 1)]
    assert len(t._ring._free) == t._ring.depth  # every slot back


def test_send_many_on_the_special_qp_is_one_post_send(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MadAgent.send_many`` over the AL's QP1: one ``post_send`` for the batch; when the
    provider refuses one, the count says how many went (those land) and the rest are not
    pending (their TIDs may be sent again)."""
    sender, _inbox = world.agent(world.a, VENDOR)
    _receiver, r_in = world.agent(world.b, VENDOR, methods={GET})
    t = sender.alias._transport  # type: ignore[attr-defined]
    calls = _spy_posts(monkeypatch, world.a, t._h_qp, fail_at=2)
    hi = sender.hi_tid << 32
    sends = [MadSend(mad(VENDOR, GET, hi | (0x300 + i)), to(world.b), timeout_ms=60_000,
                     context=i) for i in range(5)]  # fmt: skip
    assert sender.send_many(sends) == 2
    assert calls[0] == ("send", 5)
    got = sorted(int.from_bytes(r_in.recv().mad[12:16], "big") for _ in range(2))
    assert got == [0x300, 0x301]
    monkeypatch.undo()
    assert sender.send_many(sends[2:]) == 3  # not outstanding any more: sent again
    got = sorted(int.from_bytes(r_in.recv().mad[12:16], "big") for _ in range(3))
    assert got == [0x302, 0x303, 0x304] and r_in.recvs.empty()


def test_a_quiet_send_lands_and_reports_nothing(world: World) -> None:
    """``MadSend.quiet``: the MAD lands as any other, no ``MadSendDone`` comes for it (the
    loud send after it is the only report); a quiet request that would wait for its
    response is refused."""
    sender, inbox = world.agent(world.a, VENDOR)
    _receiver, r_in = world.agent(world.b, VENDOR, methods={GET})
    with pytest.raises(InvalidParameter):
        sender.send(MadSend(mad(VENDOR, GET, 1), to(world.b), timeout_ms=100, quiet=True))
    sender.send(MadSend(mad(VENDOR, GET, 2), to(world.b), context="quiet", quiet=True))
    sender.send(MadSend(mad(VENDOR, GET, 3), to(world.b), context="loud"))
    got = [int.from_bytes(r_in.recv().mad[12:16], "big") for _ in range(2)]
    assert got == [2, 3]
    assert inbox.done().context == "loud"
    sender.deregister(wait=True)  # nothing pending, so no CANCELED either
    assert inbox.dones.empty()
