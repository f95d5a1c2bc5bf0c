"""Memory verbs of an rxe CA: regions (register, query, re-register, deregister)
and type 1 windows (create, bind, destroy).

Called by the access layer on any thread; each verb takes the CA lock, never
blocks on the network, and raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ibal.ci import MwCreated
from ibal.providers import checks
from ibal.providers.rxe.memory import Mr, Mw
from ibal.providers.rxe.verbs import CaState, serialized
from ibal.transport.wc import make_wc
from ibal.types import (
    AccessFlags,
    BindWr,
    MrKeys,
    MrModMask,
    QpType,
    RecvOpt,
    SendOpt,
    WcStatus,
    WcType,
)

_CONNECTED = (QpType.RC, QpType.UC)


class MemoryVerbs(CaState):
    """``register_mr`` ... ``destroy_mw``."""

    def _readonly(self, mr: Mr) -> bool:
        return mr.view.readonly

    def _install(self, mr: Mr, acc: int, key: int | None = None) -> MrKeys:
        key = self.keys.new_key() if key is None else key
        mr.lkey = key
        mr.rkey = key if acc & checks.REMOTE else 0
        mr.access = acc
        self.keys.install(mr, key)
        return self._keys_of(mr)

    @serialized
    def register_mr(
        self, h_pd: Any, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd, acc, mv = self._region_parts(h_pd, buffer, vaddr, access)
        mr = Mr(self, pd, mv, vaddr, acc)
        self._adopt("mr", pd)
        return self._install(mr, acc)

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
        mr, pd, acc, mv = self._rereg_region(h_mr, mask, buffer, vaddr, access, h_pd)
        self.keys.remove(mr.lkey)
        self._repin(mr, pd)
        if mv is not None:
            assert vaddr is not None
            mr.view = mv
            mr.vaddr = vaddr
            mr.length = mv.nbytes
            self._unshare(mr)
        return self._install(mr, acc, self.keys.next_variant(mr.lkey))

    @serialized
    def register_smr(self, h_mr: Any, h_pd: Any, access: AccessFlags, vaddr: int) -> MrKeys:
        src = self._h_mr(h_mr)
        pd = self._h_pd(h_pd)
        acc = checks.check_shared(access, src.view.readonly, vaddr)
        self._check_count("mr", self.attr.max_mrs)
        mr = Mr(self, pd, src.view, checks.shared_vaddr(vaddr, src.vaddr, 4096), acc)
        mr.parent = src
        src.shares += 1
        self._adopt("mr", pd)
        return self._install(mr, acc)

    @serialized
    def deregister_mr(self, h_mr: Any) -> None:
        mr = self._h_mr(h_mr)
        checks.check_mr_idle(mr.windows, mr.shares)
        mr.alive = False
        self.keys.remove(mr.lkey)  # first: the C engine's copy lets go of the buffer
        if mr.parent is None:
            with contextlib.suppress(BufferError):  # let go of the consumer's buffer
                mr.view.release()  # (slices a packet still holds stay valid)
        self._unshare(mr)
        self._retire("mr", mr, mr.pd)

    # ------------------------------------------------------------------ MW
    @serialized
    def create_mw(self, h_pd: Any, mw_type: int = 1) -> MwCreated:
        pd = self._h_pd(h_pd)
        checks.check_mw_type(mw_type)
        self._check_count("mw", self.attr.max_mws)
        mw = Mw(self, pd, mw_type)
        mw.rkey = self.keys.new_key()
        self.keys.install(mw, mw.rkey)
        self._adopt("mw", pd)
        return MwCreated(mw, mw.rkey)

    @serialized
    def bind_mw(self, h_mw: Any, h_qp: Any, bind: BindWr) -> int:
        mw = self._h_mw(h_mw)
        qp = self._h_qp(h_qp)
        checks.check_bind(bind, qp.qp_type, qp.qp_type in _CONNECTED, qp.state,
                          len(qp.core.req.sq) >= qp.caps.sq_depth, mw.mw_type, mw.rkey)
        mr: Mr | None
        mr, acc = self._bind_region(bind, mw, qp)
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
        self.keys.remove(mw.rkey)
        self._retire("mw", mw, mw.pd)
