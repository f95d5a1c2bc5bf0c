"""The rxe provider's own behaviour beyond the conformance suite: configuration,
GUIDs and GIDs of address-bound devices, multicast between devices through the
sockets, QP1 MADs between two devices."""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Iterator

import pytest
from netns_util import need_root

from ibal.al import AlManager, Ca
from ibal.providers.rxe.ca import RxeCa
from ibal.providers.rxe.provider import NOT_CONFIGURED, RxeProvider
from ibal.status import InvalidParameter, InvalidPort
from ibal.testing.backdoor import CollectingRegistrar
from ibal.testing.helpers import GRH_BYTES, UD_QKEY, Side, active_port, make_side, wait_wc
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    AsyncEvent,
    AvAttr,
    DgrmInfo,
    EventRecord,
    Gid,
    Grh,
    LinkState,
    PdType,
    PortAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    SrqAttr,
    UdDest,
    WcStatus,
)

DEVICES = "rxe_t0=127.0.0.2,rxe_t1=127.0.0.3"


def _root() -> None:
    need_root()


@pytest.fixture
def two() -> Iterator[tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr]]:
    _root()
    mgr = AlManager()
    provider = RxeProvider({"devices": DEVICES})
    mgr.add_provider(provider)
    try:
        al = mgr.open_al()
        cas = [al.open_ca(g) for g in al.get_ca_guids()]
        cas.sort(key=lambda c: c.name)
        ports = [active_port(c.query().ports) for c in cas]
        assert ports[0] is not None and ports[1] is not None
        yield provider, cas[0], ports[0], cas[1], ports[1]
    finally:
        mgr.close()


def test_no_configuration_registers_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: str) -> None:
    monkeypatch.delenv("IBAL_RXE_DEVICES", raising=False)
    monkeypatch.setenv("IBAL_RXE_CONFIG", f"{tmp_path}/absent.toml")
    provider = RxeProvider({})
    registrar = CollectingRegistrar()
    provider.start(registrar)
    try:
        assert registrar.cis == {}
        assert provider.unavailable_reason == NOT_CONFIGURED
    finally:
        provider.stop()


def test_bad_options_raise_invalid_parameter() -> None:
    with pytest.raises(InvalidParameter):
        RxeProvider({"devices": "rxe0"})
    with pytest.raises(InvalidParameter):
        RxeProvider({"devices": "rxe0=lo", "colour": "blue"})


def test_devices_on_one_interface_differ(
    two: tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr],
) -> None:
    """Two devices on lo: distinct GUIDs, each GID table its own address at index 0."""
    _, a, pa, b, pb = two
    assert a.guid != b.guid
    assert [e.gid for e in pa.gid_table] == [Gid("::ffff:127.0.0.2")]
    assert [e.gid for e in pb.gid_table] == [Gid("::ffff:127.0.0.3")]


def _ud(ca: Ca, port: PortAttr) -> Side:
    side = make_side(ca, port, QpType.UD)
    side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
    return side


def test_multicast_crosses_devices_through_sockets(
    two: tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr],
) -> None:
    provider, a, pa, b, pb = two
    group = Gid("::ffff:239.1.2.3")
    r1, r2, sender = _ud(b, pb), _ud(b, pb), _ud(a, pa)
    for r in (r1, r2):
        r.qp.attach_mcast(group, 0)
        r.recv(5, 0, GRH_BYTES + 64)
    dev_b = next(ca for ca in provider.cas if ca.name == "rxe_t1")
    before = dev_b.device.counters.rx_datagrams
    av = sender.pd.create_av(AvAttr(port_num=pa.port_num, grh=Grh(dgid=group)))
    sender.put(0, b"to the group")
    sender.qp.post_send(SendWr(wr_id=1, sg_list=[sender.sge(0, 12)],
                               ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=UD_QKEY)))
    assert wait_wc(sender.cq).status is WcStatus.SUCCESS
    for r in (r1, r2):
        wc = wait_wc(r.cq)
        assert (wc.wr_id, wc.status, wc.src_qp) == (5, WcStatus.SUCCESS, sender.qp.num)
        assert r.get(GRH_BYTES, 12) == b"to the group"
        assert r.get(20 + 16, 4) == bytes([239, 1, 2, 3])  # IPv4 header: the group
    assert dev_b.device.counters.rx_datagrams == before + 1  # one datagram, two members


def test_port_counters_count_what_crossed_the_sockets(
    two: tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr],
) -> None:
    """ca.query_port_counters: kernel rxe's names, moved by one datagram each way."""
    _, a, pa, b, pb = two
    receiver, sender = _ud(b, pb), _ud(a, pa)
    receiver.recv(3, 0, GRH_BYTES + 16)
    before_a, before_b = a.query_port_counters(1), b.query_port_counters(1)
    assert {"sent_pkts", "rcvd_pkts", "duplicate_request", "drop_bad_icrc"} <= set(before_a)
    av = sender.pd.create_av(AvAttr(port_num=pa.port_num, grh=Grh(dgid=pb.gid_table[0].gid)))
    sender.put(0, b"counted")
    sender.qp.post_send(SendWr(wr_id=1, sg_list=[sender.sge(0, 7)],
                               ud=UdDest(av=av, remote_qp=receiver.qp.num,
                                         remote_qkey=UD_QKEY)))
    assert wait_wc(sender.cq).status is WcStatus.SUCCESS
    assert wait_wc(receiver.cq).status is WcStatus.SUCCESS
    after_a, after_b = a.query_port_counters(1), b.query_port_counters(1)
    assert after_a["sent_pkts"] == before_a["sent_pkts"] + 1
    assert after_b["rcvd_pkts"] == before_b["rcvd_pkts"] + 1
    with pytest.raises(InvalidPort):
        a.query_port_counters(2)


def _gsi(ca: Ca, port: PortAttr) -> Side:
    from ibal.al import QpCreate

    side = make_side(ca, port, QpType.UD)  # for its PD, CQ and buffer
    qp = side.pd.get_spl_qp(port.port_guid, QpCreate(QpType.QP1, send_cq=side.cq,
                                                     recv_cq=side.cq))
    qp.init_dgrm_svc()
    return dataclasses.replace(side, qp=qp)


def test_qp1_mad_between_devices(two: tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr]) -> None:
    """GSI over RoCE: a MAD from A's QP1 reaches B's QP1 with Q_Key 0x80010000, src QP 1."""
    _, a, pa, b, pb = two
    qa, qb = (_gsi(c, p) for c, p in ((a, pa), (b, pb)))
    mad = bytes([1, 0x04, 1, 0x01]) + bytes(range(MAD_SIZE - 4))
    qb.qp.post_recv(RecvWr(wr_id=7, sg_list=[qb.sge(1024, GRH_BYTES + MAD_SIZE)]))
    av = qa.pd.create_av(AvAttr(port_num=pa.port_num, grh=Grh(dgid=pb.gid_table[0].gid)))
    qa.put(0, mad)
    qa.qp.post_send(SendWr(wr_id=8, sg_list=[qa.sge(0, MAD_SIZE)],
                           ud=UdDest(av=av, remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY)))
    assert wait_wc(qa.cq).status is WcStatus.SUCCESS
    wc = wait_wc(qb.cq)
    assert (wc.wr_id, wc.status, wc.src_qp, wc.length) == (7, WcStatus.SUCCESS, 1,
                                                           GRH_BYTES + MAD_SIZE)
    assert qb.get(1024 + GRH_BYTES, MAD_SIZE) == mad


def test_rxe_ca_is_a_channel_interface() -> None:
    from ibal.ci import ChannelInterface

    assert issubclass(RxeCa, ChannelInterface)


# ------------------------------------------------------------ CI level


class _Upcalls:
    def __init__(self) -> None:
        self.events: queue.Queue[EventRecord] = queue.Queue()
        self.completions: queue.Queue[object] = queue.Queue()

    def event(self, rec: EventRecord) -> None:
        self.events.put(rec)

    def completion(self, ctx: object) -> None:
        self.completions.put(ctx)

    def wait_event(self, code: AsyncEvent) -> EventRecord:
        while True:
            rec = self.events.get(timeout=10)
            if rec.code is code:
                return rec


@pytest.fixture
def raw() -> Iterator[tuple[RxeProvider, CollectingRegistrar]]:
    _root()
    provider = RxeProvider({"devices": "rxe_r0=127.0.0.2"})
    registrar = CollectingRegistrar()
    provider.start(registrar)
    try:
        yield provider, registrar
    finally:
        provider.stop()


def test_posts_in_error_and_sqe_are_flushed(raw: tuple[RxeProvider, CollectingRegistrar]) -> None:
    """Sends posted to an RC QP in ERROR or a UD QP in SQE complete WR_FLUSHED_ERR
    (a UD send with a bad L_Key takes its QP to SQE)."""
    _, registrar = raw
    (ci,) = registrar.cis.values()
    up = _Upcalls()
    h_ca = ci.open_ca(up.completion, up.event, "ca")
    h_pd = ci.allocate_pd(h_ca, PdType.NORMAL)
    h_cq = ci.create_cq(h_ca, 16, "cq").handle
    buf = bytearray(64)
    keys = ci.register_mr(h_pd, memoryview(buf), 0x1000, AccessFlags.LOCAL_WRITE)
    caps = QpCaps(sq_depth=4, rq_depth=4, sq_sge=1, rq_sge=1)
    handles = []
    for qp_type, states in ((QpType.RC, (QpState.INIT, QpState.ERROR)),
                            (QpType.UD, (QpState.INIT, QpState.RTR, QpState.RTS))):  # fmt: skip
        h_qp = ci.create_qp(h_pd, qp_type, caps, h_cq, h_cq, None, True, qp_type.name).handle
        handles.append(h_qp)
        for st in states:
            if st is QpState.INIT and qp_type is QpType.UD:
                mod = QpMod(st, pkey_index=0, port_num=1, qkey=UD_QKEY)
            elif st is QpState.INIT:
                mod = QpMod(st, pkey_index=0, port_num=1, access=AccessFlags.LOCAL_WRITE)
            elif st is QpState.RTS:
                mod = QpMod(st, sq_psn=0)
            else:
                mod = QpMod(st)
            ci.modify_qp(h_qp, mod)
        if qp_type is QpType.UD:
            h_av = ci.create_av(h_pd, AvAttr(port_num=1, grh=Grh(dgid=Gid("::ffff:127.0.0.2"))))
            dest = UdDest(av=h_av, remote_qp=1, remote_qkey=UD_QKEY)
            ci.post_send(h_qp, [SendWr(wr_id=10, sg_list=[Sge(0x1000, 8, keys.lkey ^ 0xFF)],
                                       ud=dest)])
            assert ci.query_qp(h_qp).state is QpState.SQERR
        else:
            dest = None
        ci.post_send(h_qp, [SendWr(wr_id=11, sg_list=[Sge(0x1000, 8, keys.lkey)], ud=dest)])
        ci.post_recv(h_qp, [RecvWr(wr_id=12, sg_list=[Sge(0x1000, 64, keys.lkey)])])
    wcs = ci.poll_cq(h_cq, 8)
    assert [(w.wr_id, w.status) for w in wcs] == [
        (11, WcStatus.WR_FLUSHED_ERR), (12, WcStatus.WR_FLUSHED_ERR),  # RC in ERROR
        (10, WcStatus.LOCAL_PROTECTION_ERR),  # UD: the bad L_Key, then SQE
        (11, WcStatus.WR_FLUSHED_ERR),  # the send flushes, the receive waits
    ]  # fmt: skip
    ci.destroy_av(h_av)
    for h in handles:
        ci.destroy_qp(h)
    ci.deregister_mr(keys.handle)
    ci.destroy_cq(h_cq)
    ci.deallocate_pd(h_pd)
    ci.close_ca(h_ca)


def test_port_follows_the_interface() -> None:
    """Link down/up on the device's interface: PORT_DOWN/PORT_ACTIVE to the CA's
    async callback with the CA context, and query_ca shows the state."""
    from netns_util import netns
    from test_rxe_device import _dummy

    with netns() as ns:
        _dummy(ns)
        with ns.entered():
            provider = RxeProvider({"devices": "rxe0=dum0"})
            registrar = CollectingRegistrar()
            provider.start(registrar)
        try:
            (ci,) = registrar.cis.values()
            up = _Upcalls()
            h_ca = ci.open_ca(up.completion, up.event, "my-ca")
            assert ci.query_ca(h_ca).ports[0].link_state is LinkState.ACTIVE
            ns.ip("link", "set", "dum0", "down")
            rec = up.wait_event(AsyncEvent.PORT_DOWN)
            assert (rec.context, rec.port_num) == ("my-ca", 1)
            assert ci.query_ca(h_ca).ports[0].link_state is LinkState.DOWN
            ns.ip("link", "set", "dum0", "up")
            up.wait_event(AsyncEvent.PORT_ACTIVE)
            assert ci.query_ca(h_ca).ports[0].link_state is LinkState.ACTIVE
            ci.close_ca(h_ca)
        finally:
            provider.stop()


def test_removed_device_deregisters_its_ca(raw: tuple[RxeProvider, CollectingRegistrar]) -> None:
    provider, registrar = raw
    assert len(registrar.cis) == 1
    assert provider.registry is not None
    provider.registry.remove("rxe_r0")
    assert registrar.cis == {}
    assert provider.cas == []


def test_srq_qp_in_error_raises_last_wqe_reached(
    raw: tuple[RxeProvider, CollectingRegistrar],
) -> None:
    _, registrar = raw
    (ci,) = registrar.cis.values()
    up = _Upcalls()
    h_ca = ci.open_ca(up.completion, up.event, "ca")
    h_pd = ci.allocate_pd(h_ca, PdType.NORMAL)
    h_cq = ci.create_cq(h_ca, 16, "cq").handle
    h_srq = ci.create_srq(h_pd, SrqAttr(max_wr=4, max_sge=1, srq_limit=0), "srq").handle
    caps = QpCaps(sq_depth=4, rq_depth=0, sq_sge=1, rq_sge=0)
    h_qp = ci.create_qp(h_pd, QpType.RC, caps, h_cq, h_cq, h_srq, True, "the-qp").handle
    ci.modify_qp(h_qp, QpMod(QpState.INIT, pkey_index=0, port_num=1,
                             access=AccessFlags.LOCAL_WRITE))
    ci.modify_qp(h_qp, QpMod(QpState.ERROR))
    rec = up.wait_event(AsyncEvent.SRQ_QP_LAST_WQE_REACHED)
    assert rec.context == "the-qp"
    ci.destroy_qp(h_qp)
    ci.destroy_srq(h_srq)
    ci.destroy_cq(h_cq)
    ci.deallocate_pd(h_pd)
    ci.close_ca(h_ca)


def test_only_a_busy_pollers_empty_poll_reads_the_sockets(
        two: tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty poll of a CQ never armed (a busy poller) receives in the caller's thread;
    one of a CQ armed for events (its consumer polls when told, as the AL's QP1 does)
    leaves receiving to the receive thread: no system calls per poll."""
    from ibal.providers.rxe.io import DeviceIO

    _, a, _, _, _ = two
    calls: list[int] = []
    real = DeviceIO.poll_rx

    def counting(self: DeviceIO) -> int:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(DeviceIO, "poll_rx", counting)
    busy, evented = a.create_cq(8), a.create_cq(8)
    assert busy.poll() == [] and len(calls) == 1
    evented.rearm()
    assert evented.poll() == [] and evented.poll() == [] and len(calls) == 1
    busy.destroy()
    evented.destroy()
