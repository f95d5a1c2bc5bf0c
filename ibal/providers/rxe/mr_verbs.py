"""Memory verbs of an rxe CA: regions (register, query, re-register, deregister)
and type 1 windows (create, bind, destroy).

Called by the access layer on any thread; each verb takes the CA lock, never
blocks on the network, and raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ibal.ci import MwCreated
from ibal.providers.rxe.memory import (
    LOCAL_WRITE,
    MW_BIND,
    NEEDS_LOCAL_WRITE,
    REMOTE,
    Mr,
    Mw,
    byte_view,
    check_access,
)
from ibal.providers.rxe.verbs import CaState, serialized
from ibal.status import (
    InsufficientResources,
    InvalidParameter,
    InvalidPermission,
    InvalidQpState,
    InvalidRkey,
    InvalidServiceType,
    InvalidSetting,
    ResourceBusy,
)
from ibal.transport.wc import make_wc
from ibal.types import (
    AccessFlags,
    BindWr,
    MrAttr,
    MrKeys,
    MrModMask,
    QpState,
    QpType,
    RecvOpt,
    SendOpt,
    WcStatus,
    WcType,
)

_BIND_STATES = (QpState.RTS, QpState.SQD)


class MemoryVerbs(CaState):
    """``register_mr`` ... ``destroy_mw``."""

    def _install(self, mr: Mr, acc: int, key: int | None = None) -> MrKeys:
        key = self.keys.new_key() if key is None else key
        mr.lkey = key
        mr.rkey = key if acc & REMOTE else 0
        mr.access = acc
        self.keys.install(mr, key)
        return MrKeys(mr, mr.lkey, mr.rkey, mr.vaddr, mr.length)

    @serialized
    def register_mr(
        self, h_pd: Any, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd = self._h_pd(h_pd)
        if buffer is None:
            raise InvalidParameter("register_mr needs a buffer")
        acc = check_access(access)
        mv = byte_view(buffer, acc)
        if mv.nbytes > self.attr.max_mr_size:
            raise InvalidParameter(f"{mv.nbytes} bytes is above max_mr_size")
        if not isinstance(vaddr, int) or vaddr < 0 or vaddr + mv.nbytes > 1 << 64:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._count("mr", self.attr.max_mrs)
        mr = Mr(self, pd, mv, vaddr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._install(mr, acc)

    @serialized
    def query_mr(self, h_mr: Any) -> MrAttr:
        mr = self._h_mr(h_mr)
        remote = bool(mr.rkey)
        return MrAttr(
            local_lb=mr.vaddr,
            local_ub=mr.vaddr + mr.length,
            remote_lb=mr.vaddr if remote else 0,
            remote_ub=mr.vaddr + mr.length if remote else 0,
            access=AccessFlags(mr.access),
            lkey=mr.lkey,
            rkey=mr.rkey,
        )

    @serialized
    def modify_mr(
        self,
        h_mr: Any,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Any | None,
    ) -> MrKeys:
        mr = self._h_mr(h_mr)
        m = int(mask)
        if not m or m & ~int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS):
            raise InvalidParameter(f"bad re-registration mask {mask!r}")
        self._not_busy(mr)
        pd = self._h_pd(h_pd) if m & int(MrModMask.PD) else mr.pd
        if m & int(MrModMask.ACCESS):
            if access is None:
                raise InvalidParameter("MrModMask.ACCESS without access flags")
            acc = check_access(access)
        else:
            acc = mr.access
        mv = mr.view
        if m & int(MrModMask.ADDR):
            if buffer is None or vaddr is None:
                raise InvalidParameter("MrModMask.ADDR needs a buffer and an address")
            mv = byte_view(buffer, acc)
            if vaddr < 0 or vaddr + mv.nbytes > 1 << 64:
                raise InvalidSetting(f"virtual address {vaddr!r} out of range")
        elif acc & (LOCAL_WRITE | NEEDS_LOCAL_WRITE) and mv.readonly:
            raise InvalidPermission("write access requested on a read-only buffer")
        self.keys.remove(mr.lkey)
        if pd is not mr.pd:
            mr.pd.users -= 1
            pd.users += 1
            mr.pd = pd
        if mv is not mr.view:
            assert vaddr is not None
            mr.view = mv
            mr.vaddr = vaddr
            mr.length = mv.nbytes
            self._unshare(mr)
        return self._install(mr, acc, self.keys.next_variant(mr.lkey))

    @staticmethod
    def _not_busy(mr: Mr) -> None:
        if mr.windows:
            raise ResourceBusy(f"{mr.windows} memory window(s) bound to the region")
        if mr.shares:
            raise ResourceBusy(f"{mr.shares} shared region(s) use its pages")

    @staticmethod
    def _unshare(mr: Mr) -> None:
        if mr.parent is not None:
            mr.parent.shares -= 1
            mr.parent = None

    @serialized
    def register_smr(self, h_mr: Any, h_pd: Any, access: AccessFlags, vaddr: int) -> MrKeys:
        src = self._h_mr(h_mr)
        pd = self._h_pd(h_pd)
        acc = check_access(access)
        if acc & (LOCAL_WRITE | NEEDS_LOCAL_WRITE) and src.view.readonly:
            raise InvalidPermission("write access requested on read-only pages")
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._count("mr", self.attr.max_mrs)
        page = 4096  # the new address keeps the offset within the page, as the IBA asks
        assigned = vaddr - vaddr % page + src.vaddr % page if vaddr else src.vaddr
        mr = Mr(self, pd, src.view, assigned, acc)
        mr.parent = src
        src.shares += 1
        self._n["mr"] += 1
        pd.users += 1
        return self._install(mr, acc)

    @serialized
    def deregister_mr(self, h_mr: Any) -> None:
        mr = self._h_mr(h_mr)
        self._not_busy(mr)
        mr.alive = False
        if mr.parent is None:
            with contextlib.suppress(BufferError):  # let go of the consumer's buffer
                mr.view.release()  # (slices a packet still holds stay valid)
        self._unshare(mr)
        self.keys.remove(mr.lkey)
        mr.pd.users -= 1
        self._n["mr"] -= 1

    # ------------------------------------------------------------------ MW
    @serialized
    def create_mw(self, h_pd: Any, mw_type: int = 1) -> MwCreated:
        pd = self._h_pd(h_pd)
        if mw_type not in (1, 2):
            raise InvalidParameter(f"no memory window type {mw_type!r}")
        self._count("mw", self.attr.max_mws)
        mw = Mw(self, pd, mw_type)
        mw.rkey = self.keys.new_key()
        self.keys.install(mw, mw.rkey)
        self._n["mw"] += 1
        pd.users += 1
        return MwCreated(mw, mw.rkey)

    @serialized
    def query_mw(self, h_mw: Any) -> int:
        return self._h_mw(h_mw).rkey

    @serialized
    def bind_mw(self, h_mw: Any, h_qp: Any, bind: BindWr) -> int:
        mw = self._h_mw(h_mw)
        qp = self._h_qp(h_qp)
        if qp.qp_type not in (QpType.RC, QpType.UC):
            raise InvalidServiceType(f"{qp.qp_type.name} QPs cannot bind memory windows")
        if not isinstance(bind, BindWr):
            raise InvalidParameter("bind_mw needs a BindWr")
        if mw.mw_type != 1:
            raise InvalidParameter("a type 2 window is bound by a BIND_MW work request")
        if bind.current_rkey != mw.rkey:
            raise InvalidRkey(
                f"current_rkey 0x{bind.current_rkey:x} is not the window's 0x{mw.rkey:x}"
            )
        if qp.state not in _BIND_STATES:
            raise InvalidQpState(f"bind_mw on a QP in {qp.state.name}")
        if len(qp.core.req.sq) >= qp.caps.sq_depth:
            raise InsufficientResources("send queue full")
        mr: Mr | None = None
        acc = 0
        if bind.length:
            mr = self._h_mr(bind.mr)
            try:
                acc = int(bind.access) & REMOTE
            except (TypeError, ValueError):
                raise InvalidParameter(f"bad access {bind.access!r}") from None
            if not mr.access & MW_BIND:
                raise InvalidPermission("the region was not registered with MW_BIND")
            if acc & NEEDS_LOCAL_WRITE and not mr.access & LOCAL_WRITE:
                raise InvalidPermission("remote write/atomic windows need a locally writable MR")
            if bind.length < 0 or bind.addr < mr.vaddr or (
                bind.addr + bind.length > mr.vaddr + mr.length
            ):
                raise InvalidParameter("the window does not lie inside the region")
            if mr.pd is not qp.pd or mw.pd is not qp.pd:
                raise InvalidParameter("window, region and QP must share a protection domain")
        # A type 1 bind takes effect when posted (rxe executes it in the requester
        # too; nothing is on the wire), and completes at once.
        new = self.keys.next_variant(mw.rkey)
        self.keys.remove(mw.rkey)
        mw.unbind()
        if mr is not None:
            mw.mr = mr
            mr.windows += 1
            mw.addr = bind.addr
            mw.length = bind.length
            mw.access = acc
        mw.rkey = new
        self.keys.install(mw, new)
        if qp.sq_signaled or int(bind.send_opt) & int(SendOpt.SIGNALED):
            wc = make_wc(bind.wr_id, WcType.MW_BIND, WcStatus.SUCCESS, 0, None, RecvOpt.NONE,
                         qp.num)
            self.engine.complete(qp.send_cq, wc, False)
        return new

    @serialized
    def destroy_mw(self, h_mw: Any) -> None:
        mw = self._h_mw(h_mw)
        mw.unbind()
        mw.alive = False
        self.keys.remove(mw.rkey)
        mw.pd.users -= 1
        self._n["mw"] -= 1
