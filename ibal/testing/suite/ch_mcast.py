"""Chapters: multicast attachment and special QPs (QP0/QP1/raw)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ibal.status import (
    InvalidGid,
    InvalidLid,
    InvalidMcastHandle,
    InvalidPort,
    InvalidQpState,
    InvalidServiceType,
    InvalidSetting,
    NotFound,
    ResourceBusy,
    Unsupported,
)
from ibal.testing.helpers import (
    GRH_BYTES,
    UD_QKEY,
    av_to,
    is_roce,
    make_side,
    wait_wc,
)
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require, require_qp_type
from ibal.testing.suite.ch_contract import RawCa
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    AvAttr,
    DgrmInfo,
    Gid,
    Grh,
    PortAttr,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    UdDest,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Qp
    from ibal.ci import Capabilities, ChannelInterface
    from ibal.testing.helpers import Side

MGID = Gid("ff12:401b:ffff::c0de")
MLID = 0xC0DE
MGID_IPV4 = Gid("::ffff:239.192.0.222")
"""The group on a RoCE port addressed over IPv4 (RoCE v2 carries the group as an IPv4
multicast address, as rdma_cm maps it)."""


def group_for(port: PortAttr) -> tuple[Gid, int]:
    """The group the delivery checks use on ``port`` and the source GID index to send from:
    the IPv6 group, or on a RoCE port whose preferred GID is IPv4 the IPv4-mapped one."""
    if is_roce(port) and port.gids:
        from ibal.al import preferred_gid

        entry = preferred_gid(port)
        if entry.is_ipv4:
            return MGID_IPV4, entry.index
    return MGID, 0


class McastChecks(ConformanceBase):
    chapter = "multicast"

    def _ud(self, ca: Ca, port: PortAttr) -> Side:
        caps = ca.capabilities
        require(caps, "multicast")
        require_qp_type(caps, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        return side

    def _mcast_send(
        self, sender: Side, port: PortAttr, data: bytes, wr_id: int = 1, qkey: int = UD_QKEY
    ) -> None:
        mgid, sgid_index = group_for(port)
        av = sender.pd.create_av(
            AvAttr(port_num=port.port_num, dlid=MLID, grh=Grh(dgid=mgid, sgid_index=sgid_index))
        )
        sender.put(0, data)
        sender.qp.post_send(
            SendWr(
                wr_id=wr_id,
                sg_list=[sender.sge(0, len(data))],
                ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=qkey),
            )
        )
        assert wait_wc(sender.cq).status is WcStatus.SUCCESS

    @rules("ci:8")
    def test_multicast_without_capability_unsupported(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 8 / §2.11: a CA without multicast → IB_UNSUPPORTED (whatever QP
        asks, so a CA without UD is checked too)."""
        if QpType.UD not in caps.qp_types:
            assert not caps.multicast, "multicast declared without UD QPs"
            side = make_side(ca, port, next(iter(sorted(caps.qp_types))))
            with pytest.raises(Unsupported):
                side.qp.attach_mcast(MGID, MLID)
            return
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        if caps.multicast:
            side.qp.attach_mcast(MGID, MLID).detach()
            return
        with pytest.raises(Unsupported):
            side.qp.attach_mcast(MGID, MLID)

    @rules("ci:99")
    def test_attach_on_rc_raises_invalid_service_type(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 99: attaching a non-UD QP → IB_INVALID_SERVICE_TYPE."""
        require(caps, "multicast")
        require_qp_type(caps, QpType.RC)
        side = make_side(ca, port, QpType.RC)
        with pytest.raises(InvalidServiceType):
            side.qp.attach_mcast(MGID, MLID)

    @rules("ci:99")
    def test_attach_unicast_gid_raises_invalid_gid(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 99: a GID that is not multicast → IB_INVALID_GID."""
        side = self._ud(ca, port)
        with pytest.raises(InvalidGid):
            side.qp.attach_mcast(Gid("fe80::1"), MLID)

    @rules("ci:99")
    def test_attach_unicast_lid_raises_invalid_lid(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 99: a LID outside the multicast range → IB_INVALID_LID (InfiniBand)."""
        side = self._ud(ca, port)
        if is_roce(port):
            side.qp.attach_mcast(MGID, 0).detach()  # RoCE carries no LIDs: nothing to refuse
            return
        with pytest.raises(InvalidLid):
            side.qp.attach_mcast(MGID, 0x0042)

    @rules("ci:99")
    def test_detach_twice_raises_invalid_mcast_handle(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 99: detaching a detached attachment → IB_INVALID_MCAST_HANDLE."""
        side = self._ud(ca, port)
        m = side.qp.attach_mcast(MGID, MLID)
        m.detach()
        with pytest.raises(InvalidMcastHandle):
            m.detach()

    @rules("iba:mc.fanout")
    def test_multicast_reaches_every_attached_qp(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.11: a datagram to the group reaches each attached QP, with the sender as
        src_qp."""
        r1, r2, sender = self._ud(ca, port), self._ud(ca, port), self._ud(ca, port)
        for r in (r1, r2):
            r.qp.attach_mcast(group_for(port)[0], MLID)
            r.recv(5, 0, GRH_BYTES + 64)
        self._mcast_send(sender, port, b"to the group")
        for r in (r1, r2):
            wc = wait_wc(r.cq)
            assert (wc.wr_id, wc.status, wc.src_qp) == (5, WcStatus.SUCCESS, sender.qp.num)
            assert r.get(GRH_BYTES, 12) == b"to the group"

    @rules("iba:mc.detach")
    def test_detached_qp_stops_receiving(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.11: after detach, group traffic no longer reaches the QP."""
        r, sender = self._ud(ca, port), self._ud(ca, port)
        r.qp.attach_mcast(group_for(port)[0], MLID).detach()
        r.recv(6, 0, GRH_BYTES + 64)
        self._mcast_send(sender, port, b"group", 1)  # must not consume receive 6
        uni = sender.pd.create_av(av_to(port, port.port_num))
        sender.put(0, b"unicast")
        sender.qp.post_send(
            SendWr(
                wr_id=2,
                sg_list=[sender.sge(0, 7)],
                ud=UdDest(av=uni, remote_qp=r.qp.num, remote_qkey=UD_QKEY),
            )
        )
        wc = wait_wc(r.cq)
        assert (wc.wr_id, wc.src_qp) == (6, sender.qp.num)
        assert r.get(GRH_BYTES, 7) == b"unicast"

    @rules("iba:mc.qkey")
    def test_group_datagram_with_wrong_qkey_dropped(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.2.4: a group datagram whose Q_Key is not the attached QP's is dropped; the
        next one with the right Q_Key takes the receive."""
        r, sender = self._ud(ca, port), self._ud(ca, port)
        r.qp.attach_mcast(group_for(port)[0], MLID)
        r.recv(7, 0, GRH_BYTES + 64)
        self._mcast_send(sender, port, b"wrong key", 1, qkey=UD_QKEY ^ 0x1)
        self._mcast_send(sender, port, b"right key", 2)
        wc = wait_wc(r.cq)
        assert (wc.wr_id, wc.status, wc.length) == (7, WcStatus.SUCCESS, GRH_BYTES + 9)
        assert r.get(GRH_BYTES, 9) == b"right key", "the wrong Q_Key's datagram was delivered"

    @rules("doc:api.md")
    def test_destroy_attached_qp_detaches(self, ca: Ca, port: PortAttr) -> None:
        """api.md (cascade): destroying an attached QP detaches it first; the attachment goes
        invalid."""
        side = self._ud(ca, port)
        m = side.qp.attach_mcast(MGID, MLID)
        side.qp.destroy(wait=True)
        with pytest.raises(InvalidMcastHandle):
            m.detach()

    @rules("ci:61")
    def test_ci_destroy_attached_qp_raises_resource_busy(
        self, raw_cis: list[ChannelInterface]
    ) -> None:
        """ci-contract rule 61: ci_destroy_qp on a UD QP still attached → IB_RESOURCE_BUSY."""
        raw = RawCa(raw_cis[0])
        try:
            require(raw.ci.capabilities, "multicast")
            require_qp_type(raw.ci.capabilities, QpType.UD)
            h_pd = raw.pd()
            cq = raw.cq()
            qp = raw.qp(h_pd, QpType.UD, cq.handle)
            raw.ud_ready(qp.handle)
            h_mc = raw.ci.attach_mcast(qp.handle, MGID, MLID)
            with pytest.raises(ResourceBusy):
                raw.ci.destroy_qp(qp.handle)
            raw.ci.detach_mcast(h_mc)
        finally:
            raw.close()


class SpecialQpChecks(ConformanceBase):
    chapter = "special QPs"

    @pytest.fixture
    def spl(self, ca: Ca, caps: Capabilities, port: PortAttr) -> Iterator[SplMaker]:
        require(caps, "special_qps")
        yield SplMaker(ca, port)

    @pytest.fixture
    def any_spl(self, ca: Ca, port: PortAttr) -> SplMaker:
        """A :class:`SplMaker` on any CA: for the rules that hold with or without special QPs."""
        return SplMaker(ca, port)

    @rules("al:63")
    def test_qp1_has_number_1(self, spl: SplMaker) -> None:
        """access-layer rule 63: ib_get_spl_qp(QP1) gives the GSI QP, number 1."""
        qp = spl.get(QpType.QP1)
        assert qp.num == 1 and qp.qp_type is QpType.QP1

    @rules("al:63")
    def test_qp0_has_number_0(self, spl: SplMaker, caps: Capabilities) -> None:
        """access-layer rule 63: ib_get_spl_qp(QP0) gives the SMI QP, number 0."""
        if QpType.QP0 not in caps.special_qps:
            pytest.skip(f"provider lacks special_qps QP0: {caps.reason('special_qps')}")
        qp = spl.get(QpType.QP0)
        assert qp.num == 0

    @rules("ci:51")
    def test_second_qp1_raises_resource_busy(self, spl: SplMaker) -> None:
        """ci-contract rule 51: the port's QP1 exists already → IB_RESOURCE_BUSY."""
        spl.get(QpType.QP1)
        with pytest.raises(ResourceBusy):
            spl.get(QpType.QP1)

    @rules("ci:51")
    def test_qp1_available_again_after_destroy(self, spl: SplMaker) -> None:
        """ci-contract rule 51: once destroyed, the port's QP1 can be obtained again."""
        spl.get(QpType.QP1).destroy(wait=True)
        assert spl.get(QpType.QP1).num == 1

    @rules("ci:52", "al:63")
    def test_unknown_port_guid_refused(self, any_spl: SplMaker) -> None:
        """ci-contract rule 52 / access-layer rule 63: a port GUID with no port → IB_INVALID_PORT
        (or NOT_FOUND), on any CA."""
        with pytest.raises((InvalidPort, NotFound)):
            any_spl.get(QpType.QP1, port_guid=any_spl.port.port_guid ^ 0x5555_0000)

    @rules("al:63")
    def test_regular_type_raises_invalid_setting(self, any_spl: SplMaker) -> None:
        """access-layer rule 63: a type that is not special → IB_INVALID_SETTING, on any CA."""
        with pytest.raises(InvalidSetting):
            any_spl.get(QpType.UD)

    @rules("ci:53")
    def test_raw_types_match_capability(self, any_spl: SplMaker, caps: Capabilities) -> None:
        """ci-contract rule 53: raw IPv6/Ethertype QPs without CA support → IB_UNSUPPORTED;
        special QP types the CA declares are granted."""
        for raw in (QpType.RAW_IPV6, QpType.RAW_ETHER, QpType.QP1):
            if raw in caps.special_qps:
                any_spl.get(raw).destroy(wait=True)
            else:
                with pytest.raises(Unsupported):
                    any_spl.get(raw)

    @rules("al:65")
    def test_send_before_init_dgrm_svc_raises_invalid_qp_state(self, spl: SplMaker) -> None:
        """access-layer rule 65: QP0/QP1 must go through ib_init_dgrm_svc before sending."""
        qp = spl.get(QpType.QP1)
        with pytest.raises(InvalidQpState):
            qp.post_send(SendWr(wr_id=1, sg_list=[spl.mr.sge(0, MAD_SIZE)]))

    @rules("al:66")
    def test_qp1_init_dgrm_svc_without_info(self, spl: SplMaker) -> None:
        """access-layer rule 66: DgrmInfo may be omitted for QP0/QP1; the QP reaches RTS."""
        qp = spl.get(QpType.QP1)
        qp.init_dgrm_svc()
        assert qp.query().state is QpState.RTS

    @rules("al:65", "al:67")
    def test_qp1_loopback_mad(self, spl: SplMaker) -> None:
        """access-layer rules 65, 67: a MAD sent to the port's own QP1 arrives from source QP 1."""
        qp = spl.get(QpType.QP1)
        qp.init_dgrm_svc()
        port = spl.port
        av = spl.pd.create_av(
            AvAttr(
                port_num=port.port_num,
                dlid=port.lid,
                grh=Grh(dgid=port.gids[0]) if is_roce(port) else None,
            )
        )
        mad = bytearray(MAD_SIZE)
        # a vendor class: a port's PMA/SMA would answer PerfMgt or SMPs instead
        mad[0:4] = bytes([1, 0x09, 1, 0x01])  # base version, vendor class 0x09, v1, Get
        spl.buf[0:MAD_SIZE] = mad
        qp.post_recv(spl.recv_wr(7))
        qp.post_send(
            SendWr(
                wr_id=8,
                sg_list=[spl.mr.sge(0, MAD_SIZE)],
                ud=UdDest(av=av, remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY),
            )
        )
        wcs = [wait_wc(spl.cq), wait_wc(spl.cq)]
        recv = next(w for w in wcs if w.wr_id == 7)
        assert recv.status is WcStatus.SUCCESS and recv.src_qp == 1
        assert bytes(spl.buf[1024 + GRH_BYTES : 1024 + GRH_BYTES + 4]) == bytes(mad[0:4])


class SplMaker:
    """Gets special QPs on one port with a PD, CQ and 4 KiB buffer."""

    def __init__(self, ca: Ca, port: PortAttr) -> None:
        self.ca, self.port = ca, port
        self.pd = ca.alloc_pd()
        self.cq = ca.create_cq(64)
        self.buf = bytearray(4096)
        self.mr = self.pd.reg_mem(self.buf, AccessFlags.LOCAL_WRITE)

    def get(self, qp_type: QpType, port_guid: int | None = None) -> Qp:
        from ibal.al import QpCreate

        return self.pd.get_spl_qp(
            self.port.port_guid if port_guid is None else port_guid,
            QpCreate(qp_type, send_cq=self.cq, recv_cq=self.cq),
        )

    def recv_wr(self, wr_id: int) -> RecvWr:
        return RecvWr(wr_id=wr_id, sg_list=[self.mr.sge(1024, GRH_BYTES + MAD_SIZE)])
