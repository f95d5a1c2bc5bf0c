"""Chapter: handle validation (destroyed, foreign and wrong-type handles)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest

from ibal.status import (
    InvalidAvHandle,
    InvalidCqHandle,
    InvalidHandle,
    InvalidMrHandle,
    InvalidPdHandle,
    InvalidQpHandle,
    InvalidSrqHandle,
)
from ibal.testing.helpers import UD_QKEY, av_to, make_side
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, Fabric, post_raises, require, require_qp_type
from ibal.types import (
    AccessFlags,
    BindWr,
    CiOp,
    DgrmInfo,
    MrModMask,
    PortAttr,
    QpType,
    SendWr,
    UdDest,
)

if TYPE_CHECKING:
    from ibal.al import AccessLayer, Ca
    from ibal.ci import Capabilities


class HandleChecks(ConformanceBase):
    chapter = "handle validation"

    @pytest.fixture
    def foreign(self, fabric: Fabric, al: AccessLayer) -> Iterator[Ca]:
        """The same CA opened through a second AL instance."""
        other = fabric.manager.open_al()
        try:
            yield other.open_ca(al.get_ca_guids()[0])
        finally:
            other.close()

    @staticmethod
    def _type(caps: Capabilities) -> QpType:
        return next(t for t in (QpType.RC, QpType.UD, QpType.UC) if t in caps.qp_types)

    @rules("al:36")
    def test_foreign_cq_in_create_qp(self, ca: Ca, caps: Capabilities, foreign: Ca) -> None:
        """api.md / access-layer rule 36: a CQ of another AL instance → IB_INVALID_CQ_HANDLE."""
        from ibal.al import QpCreate

        mine, theirs = ca.create_cq(8), foreign.create_cq(8)
        with pytest.raises(InvalidCqHandle):
            ca.alloc_pd().create_qp(QpCreate(self._type(caps), send_cq=theirs, recv_cq=mine))

    @rules("ci:92")
    def test_foreign_av_in_send(self, ca: Ca, port: PortAttr, foreign: Ca) -> None:
        """api.md / ci-contract rule 92: an AV of another AL instance → IB_INVALID_AV_HANDLE."""
        require_qp_type(ca.capabilities, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        theirs = foreign.alloc_pd().create_av(av_to(port, port.port_num))
        with post_raises(InvalidAvHandle, 0):
            side.qp.post_send(
                SendWr(
                    wr_id=1,
                    sg_list=[side.sge(0, 4)],
                    ud=UdDest(av=theirs, remote_qp=side.qp.num, remote_qkey=UD_QKEY),
                )
            )

    @rules("ci:81")
    def test_foreign_pd_in_rereg(self, ca: Ca, caps: Capabilities, foreign: Ca) -> None:
        """api.md / ci-contract rule 81: re-registering into another AL's PD →
        IB_INVALID_PD_HANDLE."""
        require(caps, "modify_mr")
        mr = ca.alloc_pd().reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
        with pytest.raises(InvalidPdHandle):
            mr.rereg(MrModMask.PD, pd=foreign.alloc_pd())

    @rules("al:60")
    def test_foreign_mr_in_bind(self, ca: Ca, port: PortAttr, foreign: Ca) -> None:
        """api.md / access-layer rule 60: binding a window to another AL's MR →
        IB_INVALID_MR_HANDLE."""
        require(ca.capabilities, "mw_types")
        pair = self.loop(ca, port, QpType.RC)
        mw = pair.b.pd.create_mw()
        theirs = foreign.alloc_pd().reg_mem(
            bytearray(64), AccessFlags.LOCAL_WRITE | AccessFlags.MW_BIND
        )
        with pytest.raises(InvalidMrHandle):
            mw.bind(
                pair.b.qp,
                BindWr(
                    mr=theirs,
                    addr=theirs.vaddr,
                    length=64,
                    access=AccessFlags.RDMA_WRITE,
                    current_rkey=mw.rkey,
                ),
            )

    @rules("al:60")
    def test_foreign_qp_in_bind(self, ca: Ca, port: PortAttr, foreign: Ca) -> None:
        """api.md / access-layer rule 60: binding on another AL's QP → IB_INVALID_QP_HANDLE."""
        require(ca.capabilities, "mw_types")
        require_qp_type(ca.capabilities, QpType.RC)
        mine = make_side(ca, port, QpType.RC)
        theirs = make_side(foreign, port, QpType.RC)
        mw = mine.pd.create_mw()
        with pytest.raises(InvalidQpHandle):
            mw.bind(
                theirs.qp,
                BindWr(
                    mr=mine.mr,
                    addr=mine.mr.vaddr,
                    length=64,
                    access=AccessFlags.RDMA_WRITE,
                    current_rkey=mw.rkey,
                ),
            )

    @rules("al:18")
    def test_foreign_handle_in_ci_call(self, ca: Ca, foreign: Ca) -> None:
        """access-layer rule 18: a handle that does not belong to the caller → IB_INVALID_HANDLE."""
        with pytest.raises(InvalidHandle):
            ca.ci_call(CiOp(command=0), [foreign.alloc_pd()])

    @rules("doc:api.md")
    @pytest.mark.parametrize("slot", ["send_cq", "recv_cq"])
    def test_wrong_type_as_cq(self, ca: Ca, caps: Capabilities, slot: str) -> None:
        """api.md: a PD passed where a CQ belongs → IB_INVALID_CQ_HANDLE."""
        from ibal.al import QpCreate

        pd, cq = ca.alloc_pd(), ca.create_cq(8)
        kw: dict[str, Any] = {"send_cq": cq, "recv_cq": cq, slot: pd}
        with pytest.raises(InvalidCqHandle):
            pd.create_qp(QpCreate(self._type(caps), **kw))

    @rules("doc:api.md")
    def test_wrong_type_as_pd(self, ca: Ca, caps: Capabilities) -> None:
        """api.md: a CQ passed where a PD belongs → IB_INVALID_PD_HANDLE."""
        require(caps, "modify_mr")
        mr = ca.alloc_pd().reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE)
        with pytest.raises(InvalidPdHandle):
            mr.rereg(MrModMask.PD, pd=cast(Any, ca.create_cq(8)))

    @rules("al:36")
    def test_wrong_type_as_srq(self, ca: Ca, caps: Capabilities) -> None:
        """api.md / access-layer rule 36: a CQ passed as the SRQ → IB_INVALID_SRQ_HANDLE."""
        from ibal.al import QpCreate

        pd, cq = ca.alloc_pd(), ca.create_cq(8)
        with pytest.raises(InvalidSrqHandle):
            pd.create_qp(QpCreate(self._type(caps), send_cq=cq, recv_cq=cq, srq=cast(Any, cq)))

    @rules("doc:api.md")
    def test_wrong_type_as_qp(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """api.md: a CQ passed where a QP belongs → IB_INVALID_QP_HANDLE."""
        require(caps, "mw_types")
        side = make_side(ca, port, self._type(caps))
        mw = side.pd.create_mw()
        with pytest.raises(InvalidQpHandle):
            mw.bind(
                cast(Any, side.cq),
                BindWr(
                    mr=side.mr,
                    addr=side.mr.vaddr,
                    length=64,
                    access=AccessFlags.RDMA_WRITE,
                    current_rkey=mw.rkey,
                ),
            )

    @rules("doc:IBA 10.2", "doc:access-layer §4.3")
    def test_cq_of_other_ca_refused(self, al: AccessLayer, ca: Ca, caps: Capabilities) -> None:
        """IBA 10.2 / access-layer §4.3: a QP's CQs must be on its own CA → IB_INVALID_CQ_HANDLE."""
        from ibal.al import QpCreate

        others = [g for g in al.get_ca_guids() if g != ca.guid]
        if not others:
            pytest.skip("needs a second CA: provider offers 1")
        cq = al.open_ca(others[0]).create_cq(8)
        with pytest.raises(InvalidCqHandle):
            ca.alloc_pd().create_qp(QpCreate(self._type(caps), send_cq=cq, recv_cq=cq))
