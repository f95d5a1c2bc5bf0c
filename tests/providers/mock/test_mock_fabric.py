"""The provider plugin, topology, hot-plug, port events, the clock and the local SMA."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from mockenv import Node, connect, open_node

from ibal.ci import ChannelInterface, ProviderManager
from ibal.providers.mock import MockFabric, MockProvider
from ibal.status import InvalidParameter, NotFound, ResourceBusy
from ibal.types import (
    VERBS_VERSION,
    AsyncEvent,
    LinkState,
    PortCap,
    QpType,
    RecvWr,
    SendWr,
    SrqAttr,
    WcStatus,
    WrType,
)


class Registrar:
    """A minimal CaRegistrar that records what the provider does."""

    def __init__(self) -> None:
        self.cas: dict[int, ChannelInterface] = {}
        self.log: list[tuple[str, str]] = []

    def register_ca(self, ci: ChannelInterface) -> None:
        # the access layer may call into the CA before register_ca returns
        h = ci.open_ca(lambda c: None, lambda r: None, ci.name)
        assert ci.query_ca(h).ca_guid == ci.guid
        ci.close_ca(h)
        self.cas[ci.guid] = ci
        self.log.append(("add", ci.name))

    def deregister_ca(self, guid: int) -> None:
        if guid not in self.cas:
            raise NotFound(hex(guid))
        self.log.append(("remove", self.cas.pop(guid).name))


# ================================================================ provider


def test_entry_point_plugin_makes_the_provider() -> None:
    mgr = ProviderManager()
    assert "mock" in mgr.names()
    provider = mgr.create("mock", {"cas": 3, "seed": 5})
    assert isinstance(provider, MockProvider) and provider.name == "mock"
    reg = Registrar()
    provider.start(reg)
    assert [n for _, n in reg.log] == ["mock0", "mock1", "mock2"]
    assert all(
        ci.provider_name == "mock" and ci.version == VERBS_VERSION for ci in reg.cas.values()
    )
    provider.stop()
    assert reg.log[-3:] == [("remove", "mock2"), ("remove", "mock1"), ("remove", "mock0")]


def test_provider_options() -> None:
    p = MockProvider({"cas": 1, "ports": 2, "max_qps": 7, "pkeys": [0x7FFF], "seed": 3,
                      "limits": {"max_cqes": 99}})
    (ca,) = p.fabric.cas
    assert len(ca.ports) == 2 and ca.limits.max_qps == 7 and ca.limits.max_cqes == 99
    assert ca.ports[0].pkeys == [0xFFFF, 0x7FFF]
    assert MockProvider({}).fabric.cas[1].name == "mock1"  # two CAs by default
    with pytest.raises(InvalidParameter):
        MockProvider({"bogus": 1})
    fab = MockFabric(seed=9)
    assert MockProvider({"fabric": fab}).fabric is fab
    with pytest.raises(InvalidParameter):
        MockProvider({"fabric": fab, "cas": 1})


def test_identity_of_cas_and_ports() -> None:
    fab = MockFabric(seed=0x42)
    a, b = fab.add_ca(ports=2), fab.add_ca("special")
    assert b.name == "special" and a.name == "mock0"
    assert a.guid != b.guid and a.guid >> 40 == 0x021BA1
    assert (a.guid >> 24) & 0xFFFF == 0x42  # the fabric id
    assert [p.lid for p in a.ports + b.ports] == [1, 2, 3]
    assert fab.sm_lid == 1
    assert a.vendor_id == a.device_id == a.revision == 0  # no user-mode library
    assert a.ca_attr().vendor_id == 0x021BA1
    with pytest.raises(InvalidParameter):
        fab.add_ca("special")
    with pytest.raises(InvalidParameter):
        fab.add_ca(max_nonsense=1)


def test_capabilities_are_declared() -> None:
    caps = MockFabric().add_ca().capabilities
    assert caps.qp_types == {QpType.RC, QpType.UC, QpType.UD}
    assert caps.special_qps == {QpType.QP0, QpType.QP1}
    assert caps.supports_opcode(QpType.RC, WrType.FETCH_ADD)
    assert not caps.supports_opcode(QpType.UC, WrType.RDMA_READ)
    assert caps.phys_mr and caps.shared_mr and caps.local_mad and caps.vendor_call
    assert caps.async_event_injection and caps.apm  # alternate paths: test_cm_apm.py
    assert "apm" not in caps.reasons and "qp_types" in caps.reasons


def test_hotplug_add_and_remove() -> None:
    fab = MockFabric()
    fab.add_ca()
    reg = Registrar()
    provider = MockProvider({"fabric": fab})
    provider.start(reg)
    ca = fab.hotplug_add("hot", ports=1)
    assert reg.log[-1] == ("add", "hot") and ca.guid in reg.cas
    fab.hotplug_remove(ca)
    assert reg.log[-1] == ("remove", "hot") and ca not in fab.cas
    with pytest.raises(NotFound):
        ca.open_ca(lambda c: None, lambda r: None, None)
    provider.stop()
    fab.close()


def test_remove_an_open_ca_is_refused() -> None:
    fab = MockFabric()
    ca = fab.add_ca()
    h = ca.open_ca(lambda c: None, lambda r: None, None)
    with pytest.raises(ResourceBusy):
        fab.remove_ca(ca)
    ca.close_ca(h)
    fab.remove_ca(ca)


# ================================================================ topology


def test_port_down_and_up_events(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    port = a.ca.ports[0]
    fabric.set_link(port, up=False)
    assert port.state is LinkState.DOWN
    assert a.ca.query_ca(a.h).ports[0].link_state is LinkState.DOWN
    fabric.set_link(port, up=True)
    assert [(e.code, e.port_num, e.context) for e in a.events] == [
        (AsyncEvent.PORT_DOWN, 1, f"{a.ca.name}-ctx"),
        (AsyncEvent.PORT_ACTIVE, 1, f"{a.ca.name}-ctx"),
    ]
    assert b.events == []  # b's own link stayed up


def test_direct_link_isolates_the_pair(fabric: MockFabric) -> None:
    c = open_node(fabric.add_ca())
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    link = fabric.link(a.ca.ports[0], c.ca.ports[0])  # a <-> c back to back
    assert a.ca.ports[0].state is LinkState.ACTIVE
    qa, qc = connect(a, c)
    c.ca.post_recv(qc, [RecvWr(1, [c.sge(0, 8)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert c.poll()[0].status is WcStatus.SUCCESS
    qa2, _ = connect(a, b, retry_cnt=0, ack_timeout=8)  # b is on the switch: unreachable
    a.ca.post_send(qa2, [SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=b.addr(0),
                                rkey=b.mr.rkey)])
    fabric.settle()
    assert a.poll()[-1].status is WcStatus.TIMEOUT_RETRY_ERR
    fabric.set_link(link, up=False)
    states = {p.state for p in (a.ca.ports[0], c.ca.ports[0])}
    assert states == {LinkState.DOWN}


def test_two_switches_linked_together(fabric: MockFabric) -> None:
    sw = fabric.add_switch()
    c = open_node(fabric.add_ca())
    fabric.link(c.ca.ports[0], sw)
    a = open_node(fabric.cas[0])
    qa, _ = connect(a, c, retry_cnt=0, ack_timeout=8)
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=c.addr(0),
                               rkey=c.mr.rkey)])
    fabric.settle()
    assert a.poll()[0].status is WcStatus.TIMEOUT_RETRY_ERR  # separate switches
    inter = fabric.link(fabric.switch, sw)
    qa, _qc = connect(a, c)
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=c.addr(0),
                               rkey=c.mr.rkey)])
    assert a.poll()[0].status is WcStatus.SUCCESS
    assert inter.up


def test_pkey_and_lid_changes_raise_events(a: Node) -> None:
    fabric = a.ca.fabric
    port = a.ca.ports[0]
    fabric.set_pkeys(port, [0xFFFF, 0x8002])
    fabric.set_lid(port, 0x100)
    # a is the SM's port: its new LID is every port's new SM LID
    assert a.event_codes() == ["PKEY_CHANGE", "LID_CHANGE", "SM_CHANGE"]
    assert fabric.sm_lid == 0x100
    attr = a.ca.query_ca(a.h).ports[0]
    assert attr.pkeys == (0xFFFF, 0x8002) and attr.lid == 0x100
    with pytest.raises(InvalidParameter):
        fabric.set_lid(port, 0xC000)


def test_raise_event_by_object(a: Node) -> None:
    fabric = a.ca.fabric
    qp = a.qp(context="qp-ctx")
    srq = a.ca.create_srq(a.pd, SrqAttr(), "srq-ctx").handle
    fabric.raise_event(qp, AsyncEvent.QP_FATAL)
    fabric.raise_event(a.cq, AsyncEvent.CQ_ERROR)
    fabric.raise_event(srq, AsyncEvent.SRQ_CATAS_ERROR)
    fabric.raise_event(a.ca.ports[0], AsyncEvent.CLIENT_REREGISTER)
    fabric.raise_event(a.ca, AsyncEvent.LOCAL_FATAL, vendor_specific=7)
    assert [(e.code.name, e.context, e.port_num) for e in a.events] == [
        ("QP_FATAL", "qp-ctx", 0),
        ("CQ_ERROR", f"{a.ca.name}-cq", 0),
        ("SRQ_CATAS_ERROR", "srq-ctx", 0),
        ("CLIENT_REREGISTER", f"{a.ca.name}-ctx", 1),
        ("LOCAL_FATAL", f"{a.ca.name}-ctx", 0),
    ]
    assert a.events[-1].vendor_specific == 7
    a.ca.destroy_qp(qp)
    fabric.raise_event(qp, AsyncEvent.QP_FATAL)  # destroyed: never delivered
    assert len(a.events) == 5


def test_inject_async_event_passes_the_record_through(a: Node) -> None:
    from ibal.types import EventRecord

    rec = EventRecord(AsyncEvent.UNKNOWN, "anything", 0xAB, 1)
    a.ca.inject_async_event(rec)
    assert a.events == [rec]


# =================================================================== clock


def test_manual_clock_controls(fabric: MockFabric) -> None:
    assert fabric.manual and fabric.next_deadline is None
    t0 = fabric.now
    fabric.advance(1.5)
    assert fabric.now == pytest.approx(t0 + 1.5)
    with pytest.raises(ValueError):
        fabric.advance(-1)
    fabric.auto_clock()
    assert fabric.manual is False
    with pytest.raises(RuntimeError):
        fabric.advance(1)
    with pytest.raises(RuntimeError):
        fabric.settle()


def test_step_and_run_until_idle(fabric: MockFabric) -> None:
    fabric.manual_clock(inline=False)
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, _ = connect(a, b)
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey)])
    assert fabric.ready == 1 and a.poll() == []
    assert fabric.step()  # the write reaches b; its ACK is now in flight
    assert fabric.ready == 1 and a.poll() == []
    assert fabric.run_until_idle() == 1
    assert a.poll()[0].status is WcStatus.SUCCESS
    assert not fabric.step()


def test_real_time_clock_retries_on_the_timer_thread() -> None:
    """Default mode: an RNR wait is served by the timer thread (polled with a deadline)."""
    fabric = MockFabric()
    a, b = open_node(fabric.add_ca()), open_node(fabric.add_ca())
    try:
        qa, qb = connect(a, b, rnr_timer=1)  # 0.01 ms
        a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
        assert fabric.counters.rnr_naks >= 1  # no receive yet: RNR NAKed (maybe retried)
        b.ca.post_recv(qb, [RecvWr(7, [b.sge(0, 8)])])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = a.poll()
        assert got and got[0].status is WcStatus.SUCCESS
        assert b.poll()[0].wr_id == 7
    finally:
        fabric.close()


# ================================================================ local SMA


def smp(attr_id: int, attr_mod: int = 0, method: int = 1, mgmt_class: int = 1) -> bytes:
    mad = bytearray(256)
    mad[0:4] = bytes([1, mgmt_class, 1, method])
    struct.pack_into(">Q", mad, 8, 0x1234)  # TID
    struct.pack_into(">HxxI", mad, 16, attr_id, attr_mod)
    return bytes(mad)


def test_local_mad_node_info(fabric: MockFabric) -> None:
    ca = fabric.add_ca(ports=2)
    n = open_node(ca)
    out = ca.local_mad(n.h, 2, smp(0x0011))
    assert out[3] == 0x81 and struct.unpack_from(">H", out, 4)[0] == 0  # GetResp, OK
    assert out[8:16] == smp(0x0011)[8:16]  # same TID
    ni = out[64:104]
    assert (ni[0], ni[1], ni[2], ni[3]) == (1, 1, 1, 2)  # versions, CA, 2 ports
    sysguid, node_guid, port_guid = struct.unpack_from(">QQQ", ni, 4)
    assert node_guid == ca.guid and port_guid == ca.ports[1].guid and sysguid == ca.guid
    assert ni[36] == 2 and int.from_bytes(ni[37:40], "big") == 0x021BA1


def test_local_mad_port_info(a: Node) -> None:
    out = a.ca.local_mad(a.h, 1, smp(0x0015))
    pi = out[64:128]
    prefix, lid, sm_lid, cap = struct.unpack_from(">QHHI", pi, 8)
    port = a.ca.ports[0]
    assert (prefix, lid, sm_lid) == (0xFE80 << 48, port.lid, a.ca.fabric.sm_lid)
    assert PortCap(cap) == port.cap | 0x2  # IsSM: the first CA port is the SM's
    assert pi[32] & 0xF == LinkState.ACTIVE and pi[28] == 1
    assert pi[36] >> 4 == 5  # neighbour MTU 4096


def test_local_mad_directed_route_and_errors(a: Node) -> None:
    dr = a.ca.local_mad(a.h, 1, smp(0x0011, mgmt_class=0x81))
    assert struct.unpack_from(">H", dr, 4)[0] == 0x8000  # direction bit, status OK
    for mad, status in (
        (smp(0x9999), 0x000C),  # unsupported attribute: method/attribute not supported
        (smp(0x0015, attr_mod=5), 0x001C),  # no such port
        (smp(0x0011, method=0x05), 0x0008),  # unsupported method
        (smp(0x0011, mgmt_class=0x05), 0x0004),  # not a class the port's agents serve
        (smp(0x0011, method=2), 0x000C),  # Set(NodeInfo)
    ):
        assert struct.unpack_from(">H", a.ca.local_mad(a.h, 1, mad), 4)[0] == status


def test_local_mad_pkey_table_guid_info_and_description(fabric: MockFabric) -> None:
    ca = fabric.add_ca(pkeys=[0x7FFF, 0x8005], description="node under test")
    n = open_node(ca)
    keys = ca.local_mad(n.h, 1, smp(0x0016))[64:128]
    assert struct.unpack_from(">3H", keys) == (0xFFFF, 0x7FFF, 0x8005)
    assert ca.local_mad(n.h, 1, smp(0x0014))[64:72] == ca.ports[0].guid.to_bytes(8, "big")
    assert ca.local_mad(n.h, 1, smp(0x0010))[64:128].rstrip(b"\0") == b"node under test"


def test_local_mad_set_port_info(a: Node) -> None:
    mad = bytearray(smp(0x0015, method=2))
    pi = bytearray(a.ca.local_mad(a.h, 1, smp(0x0015))[64:128])
    struct.pack_into(">H", pi, 16, 0x77)  # new LID
    pi[51] |= 0x80  # client reregister
    mad[64:128] = pi
    out = a.ca.local_mad(a.h, 1, bytes(mad))
    assert struct.unpack_from(">H", out, 64 + 16)[0] == 0x77 == a.ca.ports[0].lid
    # a is the SM's port: its new LID is every port's new SM LID
    assert a.event_codes() == ["LID_CHANGE", "SM_CHANGE", "CLIENT_REREGISTER"]


def test_link_latency_delays_every_packet() -> None:
    fabric = MockProvider({"cas": 2, "latency": 0.001, "manual_clock": True}).fabric
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, _ = connect(a, b)
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey)])
    assert a.poll() == []
    fabric.advance(0.001)  # the write arrives; the ACK is on its way
    assert a.poll() == []
    fabric.advance(0.001)
    assert a.poll()[0].status is WcStatus.SUCCESS
    fabric.close()


def test_shutdown_port_through_modify_ca(a: Node) -> None:
    from ibal.types import CaMod, PortAttrMod

    a.ca.modify_ca(a.h, 1, CaMod.SHUTDOWN_PORT, PortAttrMod())
    assert a.ca.ports[0].state is LinkState.DOWN and a.event_codes() == ["PORT_DOWN"]


def test_provider_can_restart() -> None:
    provider = MockProvider({"cas": 1})
    for _ in range(2):
        reg = Registrar()
        provider.start(reg)
        assert len(reg.cas) == 1
        provider.stop()
        assert reg.cas == {}


def test_upcalls_are_made_without_the_fabric_lock(a: Node, b: Node) -> None:
    """A callback may hand work to another thread that calls the provider, and wait for it."""
    import threading

    qa, qb = connect(a, b)
    results: list[int] = []

    def on_completion(ctx: Any) -> None:
        t = threading.Thread(target=lambda: results.append(b.ca.peek_cq(b.cq)))
        t.start()
        t.join(timeout=60)  # would never finish if the callback held the fabric lock
        results.append(-1 if t.is_alive() else 0)

    b.ca.opened.completion_cb = on_completion  # type: ignore[union-attr]
    b.ca.enable_cq_notify(b.cq, False)
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 8)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert results == [1, 0]


def test_sqd_without_drain_event(a: Node, b: Node) -> None:
    from ibal.types import QpMod, QpState

    qa, _ = connect(a, b)
    a.ca.modify_qp(qa, QpMod(QpState.SQD, sqd_event=False))
    assert a.events == []
    a.ca.modify_qp(qa, QpMod(QpState.RTS))
    assert a.ca.query_qp(qa).state is QpState.RTS
