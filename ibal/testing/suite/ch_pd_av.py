"""Chapters: protection domains and address vectors."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, cast

import pytest

from ibal.status import (
    InvalidAvHandle,
    InvalidMrHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    InvalidQpHandle,
)
from ibal.testing.helpers import UD_QKEY, CallbackLog, av_to, make_side, wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, post_raises, require_qp_type
from ibal.types import (
    AccessFlags,
    AvAttr,
    DgrmInfo,
    Grh,
    PdType,
    PortAttr,
    QpType,
    SendWr,
    UdDest,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.al import Ca
    from ibal.ci import Capabilities


class PdChecks(ConformanceBase):
    chapter = "PD"

    @rules("ci:35", "al:19")
    def test_alloc_pd_accepts_every_type(self, ca: Ca) -> None:
        """ci-contract rule 35 / access-layer rule 19: every ib_pd_type_t is accepted."""
        pds = [ca.alloc_pd(t) for t in (PdType.NORMAL, PdType.UD)]
        for pd in pds:
            assert pd.ca is ca
            pd.dealloc(wait=True)

    @rules("al:19")
    def test_alloc_pd_invalid_type_raises_invalid_parameter(self, ca: Ca) -> None:
        """access-layer rule 19: an invalid pd_type → IB_INVALID_PARAMETER."""
        with pytest.raises(InvalidParameter):
            ca.alloc_pd(cast(PdType, 77))

    @rules("al:20")
    def test_pd_keeps_context(self, ca: Ca) -> None:
        """access-layer rule 20: the PD context is what its destroy callback receives."""
        token = object()
        pd = ca.alloc_pd(context=token)
        assert pd.context is token
        log = CallbackLog()
        pd.dealloc(log)
        log.wait(1)
        assert log.snapshot()[0][0] is token

    @rules("al:20", "al:114")
    def test_dealloc_pd_destroy_cb_once(self, ca: Ca) -> None:
        """access-layer rules 20, 114: ib_dealloc_pd's callback runs exactly once,
        asynchronously."""
        pd = ca.alloc_pd(context="pd")
        log = CallbackLog()
        pd.dealloc(log)
        log.wait(1)
        ca.alloc_pd().dealloc(wait=True)  # barrier: later destroys are done
        assert log.snapshot() == [("pd",)]

    @rules("ci:37")
    def test_dealloc_pd_twice_raises_invalid_pd_handle(self, ca: Ca) -> None:
        """ci-contract rule 37: deallocating a freed PD → IB_INVALID_PD_HANDLE."""
        pd = ca.alloc_pd()
        pd.dealloc(wait=True)
        with pytest.raises(InvalidPdHandle):
            pd.dealloc()

    @rules("al:20")
    def test_dealloc_pd_cascades_to_children(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """access-layer rule 20: ib_dealloc_pd releases its QPs, MRs, AVs (and MWs)."""
        side = make_side(ca, port, next(iter(sorted(caps.qp_types))))
        av = side.pd.create_av(av_to(port, port.port_num))
        side.pd.dealloc(wait=True)
        with pytest.raises(InvalidQpHandle):
            side.qp.query()
        with pytest.raises(InvalidMrHandle):
            side.mr.query()
        with pytest.raises(InvalidAvHandle):
            av.query()
        side.cq.destroy(wait=True)  # no longer busy: the QP went with the PD

    @rules("al:114")
    def test_dealloc_pd_with_wait_returns_after_callback(self, ca: Ca) -> None:
        """access-layer rule 114: with wait=True the call returns after the destroy callback ran."""
        pd = ca.alloc_pd(context=5)
        log = CallbackLog()
        pd.dealloc(log, wait=True)
        assert log.snapshot() == [(5,)]

    @rules("doc:api.md")
    def test_pd_objects_unusable_after_dealloc_returns(self, ca: Ca) -> None:
        """api.md: an asynchronously destroyed handle is invalid as soon as the call returns."""
        pd = ca.alloc_pd()
        pd.dealloc()
        with pytest.raises(InvalidPdHandle):
            pd.reg_mem(bytearray(16), AccessFlags.LOCAL_WRITE)

    @rules("ci:38", "ci:44", "ci:73")
    def test_create_on_freed_pd_raises_invalid_pd_handle(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rules 38, 44, 73: AV, QP or MR on a freed PD → IB_INVALID_PD_HANDLE."""
        from ibal.al import QpCreate

        cq = ca.create_cq(8)
        pd = ca.alloc_pd()
        pd.dealloc(wait=True)
        with pytest.raises(InvalidPdHandle):
            pd.create_av(av_to(port, port.port_num))
        with pytest.raises(InvalidPdHandle):
            pd.create_qp(QpCreate(QpType.UD, send_cq=cq, recv_cq=cq))
        with pytest.raises(InvalidPdHandle):
            pd.reg_mem(bytearray(16), AccessFlags.LOCAL_WRITE)


class AvChecks(ConformanceBase):
    chapter = "AV"

    @rules("ci:40", "al:22")
    def test_query_av_returns_attributes_and_pd(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 40 / access-layer rule 22: query gives the attributes and the PD."""
        pd = ca.alloc_pd()
        av = pd.create_av(replace(av_to(port, port.port_num), sl=2))
        got = av.query()
        assert (got.port_num, got.dlid, got.sl) == (port.port_num, port.lid, 2)
        assert av.pd is pd

    @rules("ci:40")
    def test_av_with_grh_round_trips(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 40: a GRH given at create is reported by query."""
        if not port.gids:
            pytest.fail("ACTIVE port reports no GID")
        pd = ca.alloc_pd()
        grh = Grh(dgid=port.gids[0], hop_limit=7, traffic_class=3, flow_label=0x123)
        got = pd.create_av(AvAttr(port_num=port.port_num, dlid=port.lid, grh=grh)).query()
        assert got.grh is not None
        assert (got.grh.dgid, got.grh.hop_limit, got.grh.traffic_class, got.grh.flow_label) == (
            port.gids[0],
            7,
            3,
            0x123,
        )

    @rules("ci:42", "al:22")
    def test_modify_av_reflected_in_query(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 42 / access-layer rule 22: after modify_av, query reports the new
        values."""
        pd = ca.alloc_pd()
        base = av_to(port, port.port_num)
        av = pd.create_av(replace(base, sl=0))
        av.modify(replace(base, sl=5))
        assert av.query().sl == 5

    @rules("al:21")
    def test_create_av_bad_port_raises_invalid_port(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 21 / decisions: the AL validates an AV port eagerly →
        IB_INVALID_PORT."""
        pd = ca.alloc_pd()
        base = av_to(port, port.port_num)
        with pytest.raises(InvalidPort):
            pd.create_av(replace(base, port_num=ca.query().num_ports + 1))
        with pytest.raises(InvalidPort):
            pd.create_av(replace(base, port_num=0))

    @rules("al:22")
    def test_modify_av_bad_port_raises_invalid_port(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 22: ib_modify_av with a bad port → IB_INVALID_PORT; AV unchanged."""
        pd = ca.alloc_pd()
        base = av_to(port, port.port_num)
        av = pd.create_av(base)
        with pytest.raises(InvalidPort):
            av.modify(replace(base, port_num=ca.query().num_ports + 1))
        assert av.query().port_num == port.port_num

    @rules("ci:43", "al:23")
    def test_destroyed_av_raises_invalid_av_handle(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 43 / access-layer rule 23: destroy is synchronous; later use →
        INVALID_AV_HANDLE."""
        pd = ca.alloc_pd()
        av = pd.create_av(av_to(port, port.port_num))
        av.destroy()
        with pytest.raises(InvalidAvHandle):
            av.query()
        with pytest.raises(InvalidAvHandle):
            av.modify(av_to(port, port.port_num))
        with pytest.raises(InvalidAvHandle):
            av.destroy()
        pd.dealloc(wait=True)

    @rules("ci:92")
    def test_post_send_with_destroyed_av(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract rule 92: a UD send naming a destroyed AV → IB_INVALID_AV_HANDLE at that
        WR."""
        require_qp_type(caps, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        good = side.pd.create_av(av_to(port, port.port_num))
        dead = side.pd.create_av(av_to(port, port.port_num))
        dead.destroy()
        wrs = [
            SendWr(
                wr_id=1,
                sg_list=[side.sge(0, 8)],
                ud=UdDest(av=good, remote_qp=side.qp.num, remote_qkey=UD_QKEY),
            ),
            SendWr(
                wr_id=2,
                sg_list=[side.sge(0, 8)],
                ud=UdDest(av=dead, remote_qp=side.qp.num, remote_qkey=UD_QKEY),
            ),
        ]
        with post_raises(InvalidAvHandle, 1):
            side.qp.post_send(wrs)
        wc = wait_wc(side.cq)
        assert (wc.wr_id, wc.status) == (1, WcStatus.SUCCESS)

    @rules("ci:92")
    def test_av_of_other_pd_refused_in_send(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 92 / IBA 10.2.3: an AV from another PD is not valid for the QP's
        sends."""
        require_qp_type(caps, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        foreign = ca.alloc_pd().create_av(av_to(port, port.port_num))
        wr = SendWr(
            wr_id=9,
            sg_list=[side.sge(0, 8)],
            ud=UdDest(av=foreign, remote_qp=side.qp.num, remote_qkey=UD_QKEY),
        )
        try:
            side.qp.post_send(wr)
        except InvalidAvHandle:
            return
        wc = wait_wc(side.cq)
        assert wc.wr_id == 9 and wc.status in (WcStatus.LOCAL_PROTECTION_ERR, WcStatus.LOCAL_OP_ERR)

    @rules("doc:api.md")
    def test_create_av_wrong_handle_type(self, ca: Ca, port: PortAttr) -> None:
        """api.md: a wrong-type handle passed as AV in a WR → IB_INVALID_AV_HANDLE."""
        require_qp_type(ca.capabilities, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        wr = SendWr(
            wr_id=3,
            sg_list=[side.sge(0, 8)],
            ud=UdDest(av=side.pd, remote_qp=side.qp.num, remote_qkey=UD_QKEY),
        )
        with post_raises(InvalidAvHandle, 0):
            side.qp.post_send(wr)
