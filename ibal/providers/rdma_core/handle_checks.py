"""Handle checks of an rdma_core CA (a mixin of :class:`.state.CaState`).

Every verb checks its handles here; the send queues resolve the handles a
work request names (AV, memory window and region of a ``BIND_MW``) through
the ``_ah_of``/``_bind_*_of`` callables, one pair per data path.
"""

from __future__ import annotations

import logging
from typing import Any

from ibal.ci.interface import Handle
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import peek
from ibal.providers.rdma_core.handles import Av, CaHandle, Cq, Mr, Mw, Pd, Qp, Srq
from ibal.status import (
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidQpHandle,
    InvalidSrqHandle,
)
from ibal.types import SendWr

log = logging.getLogger("ibal.providers.rdma_core")


class HandleChecks:
    """Handle checks; :class:`.state.CaState` sets the attributes below."""

    pv: Any
    ctx: Any
    name: str
    layout: peek.Layout | None

    def _ca(self, h: Handle) -> CaHandle:
        if type(h) is not CaHandle or h.ci is not self or not h.alive:
            raise InvalidCaHandle("not an open CA handle of this device")
        return h

    def _pd(self, h: Handle) -> Pd:
        if type(h) is not Pd or h.ci is not self or not h.alive:
            raise InvalidPdHandle("invalid or deallocated PD")
        return h

    def _av(self, h: Handle) -> Av:
        if type(h) is not Av or h.ci is not self or not h.alive:
            raise InvalidAvHandle("invalid or destroyed AV")
        return h

    def _cq(self, h: Handle) -> Cq:
        if type(h) is not Cq or h.ci is not self or not h.alive:
            raise InvalidCqHandle("invalid or destroyed CQ")
        return h

    def _qp(self, h: Handle) -> Qp:
        if type(h) is not Qp or h.ci is not self or not h.alive:
            raise InvalidQpHandle("invalid or destroyed QP")
        return h

    def _srq(self, h: Handle) -> Srq:
        if type(h) is not Srq or h.ci is not self or not h.alive:
            raise InvalidSrqHandle("invalid or destroyed SRQ")
        return h

    def _mr(self, h: Handle) -> Mr:
        if type(h) is not Mr or h.ci is not self or not h.alive:
            raise InvalidMrHandle("invalid or deregistered MR")
        return h

    def _mw(self, h: Handle) -> Mw:
        if type(h) is not Mw or h.ci is not self or not h.alive:
            raise InvalidMwHandle("invalid or destroyed MW")
        return h

    def _ah_of(self, av: Any) -> Any:
        """The AV's pyverbs AH; None when invalid, destroyed, or a RoCE AV without GRH."""
        if type(av) is Av and av.ci is self and av.alive:
            return av.pv
        return None

    def _bind_handles(self, wr: SendWr) -> tuple[Mw, Mr, int]:
        """A BIND_MW's window, region and ``ibv_access_flags``, checked (posting thread)."""
        mw, bind = wr.mw, wr.bind
        if type(mw) is not Mw or mw.ci is not self or not mw.alive:
            raise InvalidMwHandle("BIND_MW: invalid or destroyed window")
        if bind is None:
            raise InvalidParameter("BIND_MW needs wr.bind (a BindWr)")
        mr = self._mr(bind.mr)
        if mr.pd is not mw.pd:
            raise InvalidParameter("BIND_MW: the region must be in the window's PD")
        try:
            access = C.access_to_ibv(bind.access)
        except ValueError as exc:
            raise InvalidParameter(f"BIND_MW: {exc}") from exc
        return mw, mr, access

    def _bind_pv_of(self, wr: SendWr) -> tuple[Any, Any]:
        """A BIND_MW's pyverbs ``MW`` and ``MWBindInfo`` (the pyverbs data path)."""
        mw, mr, access = self._bind_handles(wr)
        assert wr.bind is not None
        if self.layout is not None and wr.bind.current_rkey:
            try:
                self._set_current_rkey(mw, wr.bind.current_rkey)
            except peek.PeekError as exc:
                log.debug("rdma_core %s: ibv_mw not found: %s", self.name, exc)
        return mw.pv, self.pv.mr.MWBindInfo(mr.pv, wr.bind.addr, wr.bind.length, access)

    def _bind_ptr_of(self, wr: SendWr) -> tuple[int, int, int]:
        """A BIND_MW's ``ibv_mw *``, ``ibv_mr *`` and access (the ctypes data path)."""
        mw, mr, access = self._bind_handles(wr)
        assert wr.bind is not None
        if self.layout is None:  # pragma: no cover - no fast path without a layout
            raise InvalidParameter("BIND_MW: pyverbs layout unknown")
        try:
            mw_ptr = self._set_current_rkey(mw, wr.bind.current_rkey)
            return mw_ptr, self.layout.mr_ptr(mr.pv, self.ctx), access
        except peek.PeekError as exc:
            raise InvalidParameter(f"BIND_MW: {exc}") from exc

    def _set_current_rkey(self, mw: Mw, current: int) -> int:
        """The window's ``ibv_mw *``, its ``rkey`` set to the consumer's ``current_rkey``
        (0: left alone): verbs names the window's current key there (see peek)."""
        assert self.layout is not None
        ptr = self.layout.mw_ptr(mw.pv, mw.pd.pv, self.ctx)
        if current:
            self.layout.set_mw_rkey(ptr, current & 0xFFFF_FFFF)
        return ptr

    def _ah_ptr_of(self, av: Any) -> int:
        if type(av) is Av and av.ci is self and av.alive:
            return av.ptr
        return 0
