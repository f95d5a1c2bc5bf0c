"""Memory verbs of an rdma_core CA: regions (register, query, re-register,
deregister) and type 1 windows (create, bind, destroy).

Re-registration is register-new then deregister-old; unbinding a window that
was never bound uses a scratch region (see :meth:`MemoryVerbs.bind_mw`).
Called by the access layer on any thread; raises :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
from typing import Any

from ibal.ci.interface import (
    Handle,
    MwCreated,
)
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.handles import (
    Mr,
    Mw,
    Pd,
)
from ibal.providers.rdma_core.state import CaState
from ibal.qp_fsm import sends_execute
from ibal.status import (
    InsufficientResources,
    InvalidParameter,
    InvalidPermission,
    InvalidQpState,
    InvalidRkey,
    InvalidServiceType,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    AccessFlags,
    BindWr,
    MrAttr,
    MrKeys,
    MrModMask,
    QpType,
    SendOpt,
)

_WRITE_ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC
_BIND_ACCESS = AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC


class MemoryVerbs(CaState):
    """``register_mr`` ... ``destroy_mw``."""

    def _buffer_address(self, mv: memoryview, vaddr: int, access: AccessFlags) -> None:
        if not mv.contiguous:
            raise InvalidParameter("registered memory must be contiguous")
        if mv.readonly:
            if access & _WRITE_ACCESS:
                raise InvalidPermission("a read-only buffer cannot be registered for writing")
            return
        if mv.nbytes:
            real = ctypes.addressof(ctypes.c_char.from_buffer(mv.cast("B")))
            if real != vaddr:
                raise InvalidParameter(f"vaddr {vaddr:#x} is not the buffer's address {real:#x}")

    def _register(self, pd: Pd, mv: memoryview, vaddr: int, access: AccessFlags) -> Any:
        if (
            access & (AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
            and not access & AccessFlags.LOCAL_WRITE
        ):
            raise InvalidPermission("remote write and atomic access need local write")
        try:
            ibv_access = C.access_to_ibv(access)
        except ValueError as exc:
            raise InvalidParameter(str(exc)) from exc
        if not vaddr:
            raise InvalidParameter("cannot register address 0")
        self._buffer_address(mv, vaddr, access)
        try:
            return self.pv.mr.MR(pd.pv, mv.nbytes, ibv_access, address=vaddr)
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_reg_mr", {errno.EFAULT: InvalidPermission}) from exc

    def _keys(self, mr: Mr) -> MrKeys:
        rkey = int(mr.pv.rkey) if mr.access.is_remote else 0
        return MrKeys(handle=mr, lkey=int(mr.pv.lkey), rkey=rkey, vaddr=mr.vaddr, length=mr.length)

    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd = self._pd(h_pd)
        mv = memoryview(buffer)
        with self._lock:
            pv = self._register(pd, mv, vaddr, access)
            mr = Mr(self)
            mr.pd, mr.pv, mr.buffer, mr.vaddr, mr.length = pd, pv, mv, vaddr, mv.nbytes
            mr.access = AccessFlags(access)
            pd.users += 1
            self._n["mr"] += 1
            self._areas.regions[int(pv.lkey)] = mr
            return self._keys(mr)

    def query_mr(self, h_mr: Handle) -> MrAttr:
        mr = self._mr(h_mr)
        remote = mr.access.is_remote
        return MrAttr(
            local_lb=mr.vaddr,
            local_ub=mr.vaddr + mr.length,
            remote_lb=mr.vaddr if remote else 0,
            remote_ub=mr.vaddr + mr.length if remote else 0,
            access=mr.access,
            lkey=int(mr.pv.lkey),
            rkey=int(mr.pv.rkey) if remote else 0,
        )

    def modify_mr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Handle | None,
    ) -> MrKeys:
        """Re-registration as register-new then deregister-old (rxe has no rereg_mr).

        A failure leaves the old registration untouched; success gives new keys.
        """
        mr = self._mr(h_mr)
        m = int(mask)
        if not m or m & ~int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS):
            raise InvalidParameter(f"invalid re-registration mask {m:#x}")
        new_pd = self._pd(h_pd) if m & MrModMask.PD else mr.pd
        assert new_pd is not None and mr.pd is not None
        if m & MrModMask.ADDR:
            if buffer is None or vaddr is None:
                raise InvalidParameter("MrModMask.ADDR needs a buffer and its vaddr")
            mv, va = memoryview(buffer), vaddr
        else:
            assert mr.buffer is not None
            mv, va = mr.buffer, mr.vaddr
        if m & MrModMask.ACCESS:
            if access is None:
                raise InvalidParameter("MrModMask.ACCESS needs access flags")
            acc = AccessFlags(access)
        else:
            acc = mr.access
        with self._lock:
            if mr.mws:
                raise ResourceBusy(f"{len(mr.mws)} memory windows are bound to this region")
            pv = self._register(new_pd, mv, va, acc)
            old = mr.pv
            old_lkey = int(old.lkey)
            try:
                old.close()
            except self._errs.PyverbsError as exc:
                pv.close()
                raise translate(exc, "ibv_dereg_mr", {errno.EINVAL: ResourceBusy}) from exc
            mr.pd.users -= 1
            new_pd.users += 1
            self._areas.regions.pop(old_lkey, None)
            self._areas.regions[int(pv.lkey)] = mr
            mr.pd, mr.pv, mr.buffer, mr.vaddr, mr.length, mr.access = (
                new_pd,
                pv,
                mv,
                va,
                mv.nbytes,
                acc,
            )
            return self._keys(mr)

    def deregister_mr(self, h_mr: Handle) -> None:
        mr = self._mr(h_mr)
        with self._lock:
            if mr.mws:
                raise ResourceBusy(f"{len(mr.mws)} memory windows are bound to this region")
            lkey = int(mr.pv.lkey)
            try:
                mr.pv.close()
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_dereg_mr", {errno.EINVAL: ResourceBusy}) from exc
            if self._areas.regions.get(lkey) is mr:
                del self._areas.regions[lkey]
            mr.alive = False
            assert mr.pd is not None
            mr.pd.users -= 1
            self._n["mr"] -= 1
            mr.buffer = None

    # ------------------------------------------------------------------- MW
    def create_mw(self, h_pd: Handle, mw_type: int = 1) -> MwCreated:
        pd = self._pd(h_pd)
        if mw_type not in self._caps.mw_types:
            raise Unsupported(self._caps.reason("mw_types"))
        with self._lock:
            try:
                pv = self.pv.mr.MW(pd.pv, C.IBV_MW_TYPE_2 if mw_type == 2 else C.IBV_MW_TYPE_1)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_alloc_mw") from exc
            pd.users += 1
            self._n["mw"] += 1
            mw = Mw(self, pd, pv)
            return MwCreated(mw, int(pv.rkey))

    def query_mw(self, h_mw: Handle) -> int:
        return int(self._mw(h_mw).pv.rkey)

    def bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        mw = self._mw(h_mw)
        qp = self._qp(h_qp)
        if int(mw.pv.type) == C.IBV_MW_TYPE_2:
            raise InvalidParameter("a type 2 window is bound by a BIND_MW work request")
        if qp.qp_type not in (QpType.RC, QpType.UC):
            raise InvalidServiceType("memory windows are bound on RC or UC QPs")
        if not sends_execute(qp.state):
            raise InvalidQpState(f"QP is in {qp.state.name}")
        if qp.pd is not mw.pd:
            raise InvalidParameter("the binding QP must be in the window's PD (IBA 10.6.7)")
        mr: Mr | None
        if bind.length or bind.mr is not None:
            mr = self._mr(bind.mr)
            if mr.pd is not mw.pd:
                raise InvalidParameter("the region must be in the window's PD")
        else:
            mr = mw.bound or mw.last  # an unbind names no region; verbs still wants one
        if bind.current_rkey and bind.current_rkey != int(mw.pv.rkey):
            raise InvalidRkey(f"current_rkey {bind.current_rkey:#x} is not the window's")
        acc = AccessFlags(bind.access)
        if acc & ~_BIND_ACCESS:
            raise InvalidParameter("a window grants only remote read, write and atomic access")
        if bind.length and mr is not None:
            if not mr.access & AccessFlags.MW_BIND:
                raise InvalidPermission("the region was not registered with MW_BIND access")
            if (
                acc & (AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
                and not mr.access & AccessFlags.LOCAL_WRITE
            ):
                raise InvalidPermission(
                    "remote write through a window needs local write on the region"
                )
            if bind.addr < mr.vaddr or bind.addr + bind.length > mr.vaddr + mr.length:
                raise InvalidParameter("window range outside the region")
        flags = 0
        if bind.send_opt & SendOpt.SIGNALED:
            flags |= C.IBV_SEND_SIGNALED
        if bind.send_opt & SendOpt.FENCE:
            flags |= C.IBV_SEND_FENCE
        m = self.pv.mr
        sq = qp.sq
        assert sq is not None
        scratch: Any = None
        with self._lock, sq.lock:
            if sq.acct.room() < 1:
                raise InsufficientResources(f"send queue full ({sq.acct.depth} granted)")
            try:
                if mr is None:
                    # Unbinding a window that was never bound: rxe's library reads
                    # the region's lkey even for a zero-length bind.
                    scratch = m.MR(mw.pd.pv, 8, 0)
                    region = scratch
                else:
                    region = mr.pv
                info = m.MWBindInfo(region, bind.addr, bind.length, C.access_to_ibv(acc))
                mwb = m.MWBind(info, flags, wr_id=bind.wr_id)
                qp.pv.bind_mw(mw.pv, mwb)
            except (OverflowError, TypeError, ValueError) as exc:
                raise InvalidParameter(f"bind_mw: {exc}") from exc
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_bind_mw", {errno.ENOMEM: InsufficientResources}) from exc
            finally:
                if scratch is not None:
                    with contextlib.suppress(self._errs.PyverbsError):
                        scratch.close()
            sq.acct.note_one(bool(flags & C.IBV_SEND_SIGNALED) or qp.sq_signaled)
            if mw.bound is not None:
                mw.bound.mws.discard(mw)
                mw.bound = None
            if bind.length and mr is not None:
                mw.bound = mw.last = mr
                mr.mws.add(mw)
            return int(mw.pv.rkey)

    def destroy_mw(self, h_mw: Handle) -> None:
        mw = self._mw(h_mw)
        with self._lock:
            try:
                mw.pv.close()
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_dealloc_mw") from exc
            mw.alive = False
            if mw.bound is not None:
                mw.bound.mws.discard(mw)
                mw.bound = None
            mw.pd.users -= 1
            self._n["mw"] -= 1
