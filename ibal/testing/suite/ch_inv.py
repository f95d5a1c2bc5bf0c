"""Chapter: send with invalidate, local invalidate and type 2 window binds (work requests).

These are verbs' ``IBV_WR_SEND_WITH_INV``, ``IBV_WR_LOCAL_INV`` and
``IBV_WR_BIND_MW`` with type 2 windows (IBA 10.6.7.2, 9.4.1.1.4): a CA opts in
through ``Capabilities.opcodes`` and ``mw_types``; one that does not must
refuse them with ``Unsupported`` (the checks say so instead of skipping).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ibal.status import InvalidParameter, Unsupported
from ibal.testing.helpers import wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import (
    ConformanceBase,
    deviation,
    require_opcode,
    require_qp_type,
)
from ibal.types import (
    AccessFlags,
    BindWr,
    QpType,
    RecvOpt,
    SendWr,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Mw
    from ibal.ci import Capabilities
    from ibal.testing.helpers import Pair
    from ibal.types import PortAttr

WIN = AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


def next_rkey(rkey: int) -> int:
    """The R_Key a type 2 bind may give: same index, the next key byte (``ibv_inc_rkey``)."""
    return (rkey & ~0xFF) | ((rkey + 1) & 0xFF)


class InvalidateChecks(ConformanceBase):
    chapter = "Invalidate"

    def _inv_setup(self, ca: Ca, port: PortAttr, *ops: WrType) -> tuple[Pair, Mw]:
        caps = ca.capabilities
        require_qp_type(caps, QpType.RC)
        for op in (WrType.BIND_MW, *ops):
            require_opcode(caps, QpType.RC, op)
        if 2 not in caps.mw_types:
            pytest.skip(f"provider lacks mw_types 2: {caps.reason('mw_types')}")
        pair = self.loop(ca, port, QpType.RC)
        return pair, pair.b.pd.create_mw(2)

    def _bind2(self, pair: Pair, mw: Mw, offset: int = 1024, length: int = 512) -> int:
        """B binds its type 2 window through a BIND_MW work request; returns the new R_Key."""
        rkey = next_rkey(mw.rkey)
        mr = pair.b.mr
        pair.b.qp.post_send(
            SendWr(
                wr_id=60,
                opcode=WrType.BIND_MW,
                rkey=rkey,
                mw=mw,
                bind=BindWr(mr, mr.vaddr + offset, length, WIN, current_rkey=mw.rkey),
            )
        )
        wc = wait_wc(pair.b.cq)
        assert (wc.wr_id, wc.wc_type, wc.status) == (60, WcType.MW_BIND, WcStatus.SUCCESS)
        return rkey

    def _inv_write(
        self, pair: Pair, rkey: int, offset: int, data: bytes, wr_id: int = 9
    ) -> WcStatus:
        pair.write(data, remote_addr=pair.b.remote(offset), rkey=rkey, wr_id=wr_id)
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == wr_id
        return wc.status

    # ------------------------------------------------------------ not supported
    @rules("doc:decisions")
    def test_type2_window_or_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """decisions (type 2 windows): a CA without them answers create_mw(2) IB_UNSUPPORTED."""
        pd = ca.alloc_pd()
        if 2 not in caps.mw_types:
            with pytest.raises(Unsupported):
                pd.create_mw(2)
            return
        mw = pd.create_mw(2)
        assert mw.mw_type == 2 and 0 <= mw.rkey < 1 << 32

    @rules("al:49")
    def test_unlisted_opcodes_refused_unsupported(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 49: an invalidate/bind opcode the CA does not list fails the post
        with IB_UNSUPPORTED and posts nothing (a CA of contract version 1 never sees it)."""
        caps = ca.capabilities
        require_qp_type(caps, QpType.RC)
        missing = [
            op
            for op in (WrType.SEND_WITH_INV, WrType.LOCAL_INV)
            if not caps.supports_opcode(QpType.RC, op)
        ]
        if not missing:
            pytest.skip("the CA supports send with invalidate and local invalidate")
        pair = self.loop(ca, port, QpType.RC)
        for op in missing:
            with pytest.raises(Unsupported) as exc:
                pair.a.qp.post_send(
                    [SendWr(wr_id=1, opcode=op, sg_list=[pair.a.sge(0, 8)], invalidate_rkey=1)]
                )
            assert getattr(exc.value, "failed_index", None) == 0
        assert pair.a.cq.poll(4) == []

    # ------------------------------------------------------------ type 2 windows
    @rules("iba:mp.unbound-window")
    def test_type2_window_refuses_access_until_bound(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7.2: a type 2 window's R_Key is invalid until a BIND_MW validates it."""
        pair, mw = self._inv_setup(ca, port)
        assert self._inv_write(pair, mw.rkey, 1024, b"too soon") is WcStatus.REM_ACCESS_ERR
        assert pair.b.get(1024, 8) == bytes(8)

    @rules("doc:IBA 10.6.7.2")
    def test_type2_bind_then_remote_write_lands(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7.2: a BIND_MW work request gives the window the new R_Key; a WRITE through
        it lands inside the window's range."""
        pair, mw = self._inv_setup(ca, port)
        rkey = self._bind2(pair, mw, offset=1024, length=512)
        assert self._inv_write(pair, rkey, 1100, b"through type 2") is WcStatus.SUCCESS
        assert pair.b.get(1100, 14) == b"through type 2"

    @rules("iba:mp.window-bounds")
    def test_type2_window_refuses_outside_range(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7: a WRITE past a type 2 window's range, inside the region, is refused (an
        xfail on a CA declaring the mw_bounds_check deviation)."""
        pair, mw = self._inv_setup(ca, port)
        rkey = self._bind2(pair, mw, offset=1024, length=512)
        status = self._inv_write(pair, rkey, 1536, b"past the end")
        with deviation(ca.capabilities, "mw_bounds_check"):
            assert status is WcStatus.REM_ACCESS_ERR, f"write past the window: {status.name}"
            assert pair.b.get(1536, 12) == bytes(12), "bytes landed outside the window"

    @rules("doc:IBA 10.6.7.2")
    def test_type2_window_refuses_bind_verb(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7.2: type 2 windows are bound only by work requests; ib_bind_mw refuses one."""
        pair, mw = self._inv_setup(ca, port)
        mr = pair.b.mr
        with pytest.raises(InvalidParameter):
            mw.bind(pair.b.qp, BindWr(mr, mr.vaddr, 64, WIN, current_rkey=mw.rkey))

    @rules("doc:IBA 10.6.7.2")
    def test_type2_bind_must_keep_the_index(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7.2: a type 2 bind may change only the key byte; another index completes
        MEM_WINDOW_BIND_ERR (an xfail on a CA declaring mw_bind_rkey_index)."""
        pair, mw = self._inv_setup(ca, port)
        mr = pair.b.mr
        bad = (mw.rkey + 0x100) & 0xFFFFFFFF
        pair.b.qp.post_send(
            SendWr(
                wr_id=61,
                opcode=WrType.BIND_MW,
                rkey=bad,
                mw=mw,
                bind=BindWr(mr, mr.vaddr, 64, WIN, current_rkey=mw.rkey),
            )
        )
        wc = wait_wc(pair.b.cq)
        with deviation(ca.capabilities, "mw_bind_rkey_index"):
            assert (wc.wr_id, wc.status) == (61, WcStatus.MEM_WINDOW_BIND_ERR)

    # ------------------------------------------------------------ local invalidate
    @rules("iba:mp.dead-keys")
    def test_local_invalidate_then_write_fails(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7.2: LOCAL_INV completes as LOCAL_INV and the window's R_Key stops working."""
        pair, mw = self._inv_setup(ca, port, WrType.LOCAL_INV)
        rkey = self._bind2(pair, mw)
        assert self._inv_write(pair, rkey, 1024, b"before", wr_id=8) is WcStatus.SUCCESS
        pair.b.qp.post_send(SendWr(wr_id=62, opcode=WrType.LOCAL_INV, invalidate_rkey=rkey))
        wc = wait_wc(pair.b.cq)
        assert (wc.wr_id, wc.wc_type, wc.status) == (62, WcType.LOCAL_INV, WcStatus.SUCCESS)
        assert self._inv_write(pair, rkey, 1200, b"after") is WcStatus.REM_ACCESS_ERR
        assert pair.b.get(1200, 5) == bytes(5)

    @rules("iba:mp.dead-keys")
    def test_local_invalidate_then_rebind(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7.2: an invalidated type 2 window binds again under a newer key; the old
        key stays dead."""
        pair, mw = self._inv_setup(ca, port, WrType.LOCAL_INV)
        old = self._bind2(pair, mw)
        pair.b.qp.post_send(SendWr(wr_id=63, opcode=WrType.LOCAL_INV, invalidate_rkey=old))
        assert wait_wc(pair.b.cq).status is WcStatus.SUCCESS
        mr = pair.b.mr
        new = next_rkey(old)
        pair.b.qp.post_send(
            SendWr(
                wr_id=64,
                opcode=WrType.BIND_MW,
                rkey=new,
                mw=mw,
                bind=BindWr(mr, mr.vaddr + 2048, 256, WIN, current_rkey=old),
            )
        )
        assert wait_wc(pair.b.cq).status is WcStatus.SUCCESS
        assert self._inv_write(pair, new, 2048, b"rebound", wr_id=10) is WcStatus.SUCCESS
        assert pair.b.get(2048, 7) == b"rebound"
        assert self._inv_write(pair, old, 2100, b"stale", wr_id=11) is WcStatus.REM_ACCESS_ERR

    @rules("doc:decisions")
    def test_local_invalidate_of_a_region_key_fails(self, ca: Ca, port: PortAttr) -> None:
        """decisions (invalidate): regions registered the ordinary way cannot be invalidated (as
        in IBA and kernel rxe); the LOCAL_INV completes in error."""
        pair, _ = self._inv_setup(ca, port, WrType.LOCAL_INV)
        pair.b.qp.post_send(
            SendWr(wr_id=65, opcode=WrType.LOCAL_INV, invalidate_rkey=pair.b.mr.rkey)
        )
        wc = wait_wc(pair.b.cq)
        assert wc.wr_id == 65 and wc.status is not WcStatus.SUCCESS

    # ------------------------------------------------------------ send with invalidate
    @rules("iba:mp.dead-keys")
    def test_send_with_invalidate(self, ca: Ca, port: PortAttr) -> None:
        """IBA 9.4.1.1.4: after a SEND with invalidate the receive completes with
        RecvOpt.INVALIDATE and the R_Key, the bytes land, and a later WRITE with that R_Key
        fails REM_ACCESS_ERR."""
        pair, mw = self._inv_setup(ca, port, WrType.SEND_WITH_INV)
        rkey = self._bind2(pair, mw)
        pair.b.recv(100, 0, 64)
        pair.a.put(0, b"invalidate this")
        pair.a.qp.post_send(
            SendWr(
                wr_id=1,
                opcode=WrType.SEND_WITH_INV,
                sg_list=[pair.a.sge(0, 15)],
                invalidate_rkey=rkey,
            )
        )
        send, recv = pair.wait_pair()
        assert (send.wc_type, send.status) == (WcType.SEND, WcStatus.SUCCESS)
        assert (recv.wr_id, recv.wc_type, recv.status) == (100, WcType.RECV, WcStatus.SUCCESS)
        assert recv.recv_opt & RecvOpt.INVALIDATE and recv.invalidated_rkey == rkey
        assert recv.length == 15 and pair.b.get(0, 15) == b"invalidate this"
        assert self._inv_write(pair, rkey, 1100, b"stale key") is WcStatus.REM_ACCESS_ERR
        assert pair.b.get(1100, 9) == bytes(9)

    @rules("doc:decisions")
    def test_send_with_invalidate_of_a_region_fails(self, ca: Ca, port: PortAttr) -> None:
        """decisions (invalidate): a SEND with invalidate naming a key the receiver cannot
        invalidate (a region's) completes the receive REM_INVALID_REQ_ERR (kernel rxe's class
        J) and the send fails too (an xfail on a CA declaring invalidate_nak)."""
        pair, _ = self._inv_setup(ca, port, WrType.SEND_WITH_INV)
        pair.b.recv(100, 0, 64)
        pair.a.put(0, b"bad key")
        pair.a.qp.post_send(
            SendWr(
                wr_id=1,
                opcode=WrType.SEND_WITH_INV,
                sg_list=[pair.a.sge(0, 7)],
                invalidate_rkey=pair.b.mr.rkey,
            )
        )
        recv = wait_wc(pair.b.cq)
        assert (recv.wr_id, recv.status) == (100, WcStatus.REM_INVALID_REQ_ERR)
        assert not recv.recv_opt & RecvOpt.INVALIDATE
        send = wait_wc(pair.a.cq)
        assert send.wr_id == 1
        with deviation(ca.capabilities, "invalidate_nak"):
            assert send.status is not WcStatus.SUCCESS, "the refused SEND completed SUCCESS"
