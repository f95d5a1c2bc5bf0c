"""The rxe provider's own behaviour beyond the conformance suite: configuration,
GUIDs and GIDs of address-bound devices, multicast between devices through the
sockets, QP1 MADs between two devices."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from netns_util import need_root

from ibal.al import AlManager, Ca
from ibal.providers.rxe.ca import RxeCa
from ibal.providers.rxe.provider import NOT_CONFIGURED, RxeProvider
from ibal.status import InvalidParameter
from ibal.testing.backdoor import CollectingRegistrar
from ibal.testing.helpers import GRH_BYTES, UD_QKEY, Side, active_port, make_side, wait_wc
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    AvAttr,
    DgrmInfo,
    Gid,
    Grh,
    PortAttr,
    QpType,
    RecvWr,
    SendWr,
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
