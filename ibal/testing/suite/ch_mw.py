"""Chapter: memory windows (create, bind, unbind, destroy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ibal.status import (
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPermission,
    InvalidRkey,
    InvalidServiceType,
    ResourceBusy,
    Unsupported,
)
from ibal.testing.helpers import Side, connect, make_pair, make_side, wait_wc
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, deviation, require, require_qp_type
from ibal.types import (
    AccessFlags,
    BindWr,
    DgrmInfo,
    MrModMask,
    PortAttr,
    QpType,
    SendOpt,
    SendWr,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import Ca, Mr, Mw
    from ibal.ci import Capabilities
    from ibal.testing.helpers import Pair

WIN = AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


class MwChecks(ConformanceBase):
    chapter = "MW"

    def _mw_setup(self, ca: Ca, port: PortAttr) -> tuple[Pair, Mw]:
        caps = ca.capabilities
        require(caps, "mw_types")
        require_qp_type(caps, QpType.RC)
        pair = self.loop(ca, port, QpType.RC)
        return pair, pair.b.pd.create_mw()

    def _bind(
        self,
        pair: Pair,
        mw: Mw,
        mr: Mr | None = None,
        offset: int = 1024,
        length: int = 512,
        access: AccessFlags = WIN,
        wr_id: int = 50,
    ) -> int:
        """Bind ``mw`` on B's QP to ``[offset, offset+length)`` of ``mr``; wait the completion."""
        target = pair.b.mr if mr is None else mr
        rkey = mw.bind(
            pair.b.qp,
            BindWr(
                mr=target,
                addr=target.vaddr + offset,
                length=length,
                access=access,
                current_rkey=mw.rkey,
                wr_id=wr_id,
            ),
        )
        wc = wait_wc(pair.b.cq)
        assert (wc.wr_id, wc.wc_type, wc.status) == (wr_id, WcType.MW_BIND, WcStatus.SUCCESS)
        return rkey

    def _write(self, pair: Pair, rkey: int, addr: int, data: bytes, wr_id: int = 9) -> WcStatus:
        pair.write(data, remote_addr=addr, rkey=rkey, wr_id=wr_id)
        wc = wait_wc(pair.a.cq)
        assert wc.wr_id == wr_id
        return wc.status

    @rules("ci:8")
    def test_create_mw_without_capability_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 8: a CA without windows answers ib_create_mw with IB_UNSUPPORTED."""
        pd = ca.alloc_pd()
        if caps.mw_types:
            mw = pd.create_mw()
            assert 0 <= mw.rkey < 1 << 32
            return
        with pytest.raises(Unsupported):
            pd.create_mw()

    @rules("ci:86", "al:59", "iba:mp.unbound-window")
    def test_unbound_window_refuses_access(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 86 / access-layer rule 59: a new window's R_Key is unusable until
        bound."""
        pair, mw = self._mw_setup(ca, port)
        assert (
            self._write(pair, mw.rkey, pair.b.remote(1024), b"too soon") is WcStatus.REM_ACCESS_ERR
        )
        assert pair.b.get(1024, 8) == bytes(8)

    @rules("ci:87", "al:60")
    def test_bind_returns_new_rkey_and_completion(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 87 / access-layer rule 60: bind returns the new R_Key; a signaled bind
        completes."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw)
        assert rkey == mw.rkey and 0 <= rkey < 1 << 32
        assert mw.query()[1] == rkey

    @rules("al:60")
    def test_bound_window_allows_access_in_range(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 60: remote access through the bound window lands in the MR's bytes."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw, offset=1024, length=512)
        assert (
            self._write(pair, rkey, pair.b.remote(1100), b"through the window") is WcStatus.SUCCESS
        )
        assert pair.b.get(1100, 18) == b"through the window"

    @rules("iba:mp.window-bounds")
    def test_bound_window_refuses_outside_range(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7: access outside the bound range → REM_ACCESS_ERR even inside the MR (an
        xfail on a CA declaring the mw_bounds_check deviation, never a skip)."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw, offset=1024, length=512)
        status = self._write(pair, rkey, pair.b.remote(1536 - 4), b"spills over")
        with deviation(ca.capabilities, "mw_bounds_check"):
            assert status is WcStatus.REM_ACCESS_ERR, f"write past the window: {status.name}"
            assert pair.b.get(1532, 11) == bytes(11), "bytes landed outside the window"

    @rules("iba:mp.window-rights")
    def test_bound_window_enforces_its_rights(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7: a window bound for RDMA READ only refuses RDMA WRITE."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw, access=AccessFlags.RDMA_READ)
        assert self._write(pair, rkey, pair.b.remote(1024), b"ro") is WcStatus.REM_ACCESS_ERR

    @rules("ci:88", "iba:mp.unbound-window")
    def test_zero_length_bind_invalidates(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 88: bind with length 0 unbinds; the window refuses access again."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw)
        assert self._write(pair, rkey, pair.b.remote(1024), b"ok", 1) is WcStatus.SUCCESS
        new = mw.bind(
            pair.b.qp,
            BindWr(mr=None, addr=0, length=0, access=AccessFlags.NONE, current_rkey=rkey, wr_id=51),
        )
        assert wait_wc(pair.b.cq).status is WcStatus.SUCCESS
        assert new == mw.rkey
        assert self._write(pair, new, pair.b.remote(1024), b"no", 2) is WcStatus.REM_ACCESS_ERR

    @rules("ci:88")
    def test_rebind_to_another_region(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 88: a bound window may be re-bound to a different MR of the PD."""
        pair, mw = self._mw_setup(ca, port)
        self._bind(pair, mw)
        other_buf = bytearray(1024)
        other = pair.b.pd.reg_mem(
            other_buf, AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.MW_BIND
        )
        rkey = self._bind(pair, mw, mr=other, offset=0, length=256, wr_id=52)
        assert self._write(pair, rkey, other.vaddr + 10, b"rebound") is WcStatus.SUCCESS
        assert bytes(other_buf[10:17]) == b"rebound"

    @rules("al:61")
    def test_query_mw_reports_pd_and_current_rkey(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 61: ib_query_mw gives the PD and the current R_Key (changed by
        binds)."""
        pair, mw = self._mw_setup(ca, port)
        pd, key = mw.query()
        assert pd is pair.b.pd and key == mw.rkey
        rkey = self._bind(pair, mw)
        assert mw.query() == (pair.b.pd, rkey)

    @rules("ci:89", "iba:mp.dead-keys")
    def test_destroyed_window_key_refused(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 89: after destroy, remote access with the window's last R_Key fails."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw)
        mw.destroy()
        assert self._write(pair, rkey, pair.b.remote(1024), b"gone") is WcStatus.REM_ACCESS_ERR

    @rules("ci:89", "al:61")
    def test_destroy_mw_twice_raises_invalid_mw_handle(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 89 / access-layer rule 61: destroy is synchronous; later use →
        IB_INVALID_MW_HANDLE."""
        require(caps, "mw_types")
        mw = ca.alloc_pd().create_mw()
        mw.destroy()
        with pytest.raises(InvalidMwHandle):
            mw.query()
        with pytest.raises(InvalidMwHandle):
            mw.destroy()

    @rules("ci:87", "al:60")
    def test_bind_on_ud_qp_raises_invalid_service_type(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 87 / access-layer rule 60: a QP type that cannot bind →
        IB_INVALID_SERVICE_TYPE."""
        require(caps, "mw_types")
        require_qp_type(caps, QpType.UD)
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=0x1234))
        mw = side.pd.create_mw()
        with pytest.raises(InvalidServiceType):
            mw.bind(
                side.qp,
                BindWr(mr=side.mr, addr=side.mr.vaddr, length=64, access=WIN, current_rkey=mw.rkey),
            )

    @rules("al:60")
    def test_bind_with_wrong_current_rkey_raises_invalid_rkey(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 60: a current_rkey that is not the window's → IB_INVALID_RKEY."""
        pair, mw = self._mw_setup(ca, port)
        with pytest.raises(InvalidRkey):
            mw.bind(
                pair.b.qp,
                BindWr(
                    mr=pair.b.mr,
                    addr=pair.b.mr.vaddr,
                    length=64,
                    access=WIN,
                    current_rkey=mw.rkey ^ 0xFF,
                ),
            )

    @rules("al:60")
    def test_bind_with_deregistered_mr_raises_invalid_mr_handle(
        self, ca: Ca, port: PortAttr
    ) -> None:
        """access-layer rule 60: a bad MR in the bind → IB_INVALID_MR_HANDLE."""
        pair, mw = self._mw_setup(ca, port)
        dead = pair.b.pd.reg_mem(bytearray(64), AccessFlags.LOCAL_WRITE | AccessFlags.MW_BIND)
        dead.dereg()
        with pytest.raises(InvalidMrHandle):
            mw.bind(pair.b.qp, BindWr(mr=dead, addr=0, length=64, access=WIN, current_rkey=mw.rkey))

    @rules("doc:ci-contract §2.8")
    def test_bind_beyond_region_refused(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.8: a bind range outside the MR fails (at once or as
        MEM_WINDOW_BIND_ERR)."""
        pair, mw = self._mw_setup(ca, port)
        wr = BindWr(
            mr=pair.b.mr,
            addr=pair.b.mr.vaddr + len(pair.b.buf) - 16,
            length=64,
            access=WIN,
            current_rkey=mw.rkey,
            wr_id=53,
        )
        try:
            mw.bind(pair.b.qp, wr)
        except (InvalidParameter, InvalidPermission):
            return
        wc = wait_wc(pair.b.cq)
        assert (wc.wr_id, wc.status) == (53, WcStatus.MEM_WINDOW_BIND_ERR)

    @rules("doc:ci-contract §2.8")
    def test_bind_needs_mw_bind_right_on_region(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.8: binding to an MR registered without MW_BIND → IB_INVALID_PERMISSION (or
        bind error)."""
        pair, mw = self._mw_setup(ca, port)
        plain = pair.b.pd.reg_mem(bytearray(256), AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
        wr = BindWr(
            mr=plain, addr=plain.vaddr, length=64, access=WIN, current_rkey=mw.rkey, wr_id=54
        )
        try:
            mw.bind(pair.b.qp, wr)
        except InvalidPermission:
            return
        wc = wait_wc(pair.b.cq)
        assert (wc.wr_id, wc.status) == (54, WcStatus.MEM_WINDOW_BIND_ERR)

    @rules("ci:83", "al:56")
    def test_dereg_mr_with_bound_window_raises_resource_busy(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 83 / access-layer rule 56: dereg with a window bound → IB_RESOURCE_BUSY;
        MR stays valid."""
        pair, mw = self._mw_setup(ca, port)
        self._bind(pair, mw)
        with pytest.raises(ResourceBusy):
            pair.b.mr.dereg()
        assert pair.b.mr.query().lkey == pair.b.mr.lkey
        pair.write(b"still registered", dst_off=64)
        assert wait_wc(pair.a.cq).status is WcStatus.SUCCESS

    @rules("ci:79", "al:57")
    def test_rereg_mr_with_bound_window_raises_resource_busy(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract rule 79 / access-layer rule 57: re-registration with a window bound →
        IB_RESOURCE_BUSY."""
        require(ca.capabilities, "modify_mr")
        pair, mw = self._mw_setup(ca, port)
        self._bind(pair, mw)
        keys = (pair.b.mr.lkey, pair.b.mr.rkey)
        with pytest.raises(ResourceBusy):
            pair.b.mr.rereg(MrModMask.ACCESS, access=AccessFlags.LOCAL_WRITE)
        assert (pair.b.mr.lkey, pair.b.mr.rkey) == keys

    @rules("al:60")
    def test_window_usable_through_any_qp_of_its_pd(self, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 60: the bound window serves every QP of the same PD, not only the
        binding one."""
        pair, mw = self._mw_setup(ca, port)
        rkey = self._bind(pair, mw)
        from ibal.al import QpCreate

        qp2 = pair.b.pd.create_qp(QpCreate(QpType.RC, send_cq=pair.b.cq, recv_cq=pair.b.cq))
        b2 = Side(pair.b.ca, pair.b.port, pair.b.pd, pair.b.cq, pair.b.buf, pair.b.mr, qp2)
        a2 = make_pair(ca, port, ca, port, QpType.RC, do_connect=False).a
        connect(a2, b2, ca.capabilities)
        a2.put(0, b"second qp")
        a2.qp.post_send(
            SendWr(
                wr_id=1,
                opcode=WrType.RDMA_WRITE,
                sg_list=[a2.sge(0, 9)],
                remote_addr=pair.b.remote(1200),
                rkey=rkey,
            )
        )
        assert wait_wc(a2.cq).status is WcStatus.SUCCESS
        assert pair.b.get(1200, 9) == b"second qp"

    @rules("doc:ci-contract §2.8")
    def test_unsignaled_bind_gives_no_completion(self, ca: Ca, port: PortAttr) -> None:
        """ci-contract §2.8: with selective signaling, an unsignaled bind produces no CQ entry."""
        require(ca.capabilities, "mw_types")
        pair = self.loop(ca, port, QpType.RC, sq_signaled=False)
        mw = pair.b.pd.create_mw()
        rkey = mw.bind(
            pair.b.qp,
            BindWr(
                mr=pair.b.mr,
                addr=pair.b.mr.vaddr,
                length=256,
                access=WIN,
                current_rkey=mw.rkey,
                wr_id=60,
                send_opt=SendOpt.NONE,
            ),
        )
        assert self._write(pair, rkey, pair.b.remote(8), b"bound") is WcStatus.SUCCESS
        assert pair.b.cq.poll() == []  # the bind ran (the write got through) but did not complete

    @rules("iba:mp.window-pd")
    def test_bind_on_qp_of_other_pd_refused(self, ca: Ca, port: PortAttr) -> None:
        """IBA 10.6.7: the binding QP must be in the window's PD."""
        pair, mw = self._mw_setup(ca, port)
        wr = BindWr(
            mr=pair.b.mr,
            addr=pair.b.mr.vaddr,
            length=64,
            access=WIN,
            current_rkey=mw.rkey,
            wr_id=61,
        )
        try:
            mw.bind(pair.a.qp, wr)
        except InvalidParameter:
            return
        wc = wait_wc(pair.a.cq)
        assert (wc.wr_id, wc.status) == (61, WcStatus.MEM_WINDOW_BIND_ERR)
