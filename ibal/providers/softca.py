"""What the software CAs' verbs (the mock and rxe) share beyond argument checks.

:class:`SoftCa` is the base of each provider's verb state: handle ownership,
the live-resource counts against the CA's limits, the references a resource
holds on its PD, CQs and SRQ, and the verbs whose whole body is that
bookkeeping (``create_srq``, ``modify_srq``, ``query_srq``, ``resize_cq``,
``query_cq``, ``query_av``, ``query_mr``, ``query_mw``, ``unmap_fmr``,
``dealloc_fmr``), and the common front of ``create_qp``, ``modify_qp``,
``create_cq``, ``register_mr`` and the re-registrations.  One copy, so both CAs
count and refuse alike.  A shared verb
runs under the provider's own verb discipline, :meth:`SoftCa._verb` (the
mock's fabric lock with verb faults, rxe's CA lock); the providers' other
verbs keep their own decorators.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from ibal import qp_fsm
from ibal.ci import Capabilities, SrqCreated
from ibal.providers import checks
from ibal.status import IbError, InsufficientResources, InvalidParameter, ResourceBusy
from ibal.types import (
    AccessFlags,
    AvAttr,
    MrAttr,
    MrKeys,
    MrModMask,
    QpCaps,
    QpMod,
    QpType,
    SrqAttr,
    SrqAttrMask,
)

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H")
_S = TypeVar("_S", bound="SoftCa")


class Limits(checks.Limits, Protocol):
    """The CA limits the bookkeeping reads besides the checks' (``CaAttr`` fields)."""

    @property
    def max_srqs(self) -> int: ...
    @property
    def max_mrs(self) -> int: ...
    @property
    def max_cqs(self) -> int: ...


class Users(Protocol):
    """A resource others pin (a PD, CQ or SRQ): how many use it."""

    users: int


def shared(fn: Callable[Concatenate[_S, P], R]) -> Callable[Concatenate[_S, P], R]:
    """A verb :class:`SoftCa` defines once, run under the provider's ``_verb``."""
    name = fn.__name__

    @functools.wraps(fn)
    def run(self: _S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._verb(name, fn, self, *args, **kwargs)

    return run


class SoftCa:
    """Handle ownership and resource bookkeeping of one software CA."""

    name: str
    _n: dict[str, int]

    # ------------------------------------------------- what a provider supplies
    def _verb(self, name: str, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """Run verb ``name`` (``fn(*args)``) as the provider runs its verbs."""
        raise NotImplementedError

    @property
    def capabilities(self) -> Capabilities:
        raise NotImplementedError

    @property
    def _lim(self) -> Limits:
        raise NotImplementedError

    def _make_srq(self, pd: Any, attr: SrqAttr, context: Any) -> Any:
        raise NotImplementedError

    def _h_ca(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_pd(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_qp(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_mr(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_cq(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_srq(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_av(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_mw(self, h: Any) -> Any:
        raise NotImplementedError

    def _h_fmr(self, h: Any) -> Any:
        raise NotImplementedError

    def _drop_mapping(self, fmr: Any) -> None:
        raise NotImplementedError

    def _readonly(self, mr: Any) -> bool:
        """Whether any of the region's pages is a read-only buffer."""
        raise NotImplementedError

    # ----------------------------------------------------------- bookkeeping
    def _own(self, h: Any, kind: type[H], error: type[IbError], what: str) -> H:
        """``h`` if it is a live ``kind`` of this CA, else ``error``."""
        if type(h) is not kind or getattr(h, "ca", None) is not self or not h.alive:  # type: ignore[attr-defined]
            raise error(f"not {what} of {self.name}: {h!r}")
        return h

    def _check_count(self, kind: str, limit: int) -> None:
        if self._n[kind] >= limit:
            raise InsufficientResources(f"{self.name}: no more {kind.upper()}s (limit {limit})")

    def _close(self, h_ca: Any) -> None:
        """``close_ca``'s check: the open handle dies only with no resource left."""
        h = self._h_ca(h_ca)
        busy = {k: v for k, v in self._n.items() if v}
        if busy:
            raise ResourceBusy(f"{self.name} still has {busy}")
        h.alive = False

    def _adopt(self, kind: str, pd: Users | None = None) -> None:
        """Count a new resource of ``kind``, pinning its PD."""
        self._n[kind] += 1
        if pd is not None:
            pd.users += 1

    def _retire(self, kind: str, obj: Any, pd: Users | None = None) -> None:
        """``obj`` is gone: its handle dies, its count and its pin on ``pd`` go."""
        obj.alive = False
        self._n[kind] -= 1
        if pd is not None:
            pd.users -= 1

    @staticmethod
    def _repin(obj: Any, pd: Users) -> None:
        """A re-registration moves ``obj`` (its ``pd``) onto ``pd``."""
        if pd is not obj.pd:
            obj.pd.users -= 1
            pd.users += 1
            obj.pd = pd

    @staticmethod
    def _unshare(mr: Any) -> None:
        """A shared region lets go of the region whose pages it used."""
        if mr.parent is not None:
            mr.parent.shares -= 1
            mr.parent = None

    def _pin_qp(self, qp: Any) -> None:
        """Count a new QP and what it uses: its PD, CQs and SRQ."""
        self._adopt("qp", qp.pd)
        qp.send_cq.users += 1
        qp.recv_cq.users += 1
        if qp.srq is not None:
            qp.srq.users += 1

    def _unpin_qp(self, qp: Any) -> None:
        self._retire("qp", qp, qp.pd)
        qp.send_cq.users -= 1
        qp.recv_cq.users -= 1
        if qp.srq is not None:
            qp.srq.users -= 1

    def _release_pd(self, pd: Any) -> None:
        """``deallocate_pd``'s check and bookkeeping: nothing may still use the PD."""
        if pd.users:
            raise ResourceBusy(f"PD still used by {pd.users} QP/SRQ/AV/MR/MW")
        self._retire("pd", pd)

    def _release_cq(self, cq: Any) -> None:
        """``destroy_cq``'s check and bookkeeping: no QP may still use the CQ."""
        if cq.users:
            raise ResourceBusy(f"CQ still used by {cq.users} QP(s)")
        self._retire("cq", cq)

    def _release_srq(self, srq: Any) -> None:
        """``destroy_srq``'s check and bookkeeping: no QP may still use the SRQ."""
        if srq.users:
            raise ResourceBusy(f"SRQ still used by {srq.users} QP(s)")
        self._retire("srq", srq, srq.pd)
        srq.wqes.clear()

    def _qp_parts(self, h_pd: Any, qp_type: QpType, caps: QpCaps, send_cq: Any, recv_cq: Any,
                  srq: Any | None, makes: Container[QpType]) -> tuple[Any, Any, Any, Any]:
        """``create_qp``'s handles and arguments, checked: (PD, send CQ, receive CQ, SRQ)."""
        pd = self._h_pd(h_pd)
        scq = self._h_cq(send_cq)
        rcq = self._h_cq(recv_cq)
        s = self._h_srq(srq) if srq is not None else None
        checks.check_create_qp(qp_type, makes, self.capabilities.reason("qp_types"),
                               s.pd if s is not None else None, pd)
        checks.check_qp_caps(caps, self._lim, s is not None)
        return pd, scq, rcq, s

    def _region_parts(self, h_pd: Any, buffer: Any, vaddr: int,
                      access: AccessFlags) -> tuple[Any, int, memoryview]:
        """``register_mr``'s PD, access bits and byte view, with room for a region."""
        pd = self._h_pd(h_pd)
        acc, mv = checks.check_region(buffer, vaddr, access, self._lim)
        self._check_count("mr", self._lim.max_mrs)
        return pd, acc, mv

    def _rereg_target(self, h_mr: Any, mask: MrModMask, h_pd: Any) -> tuple[Any, int, Any]:
        """A re-registration's region, mask bits and PD: (MR, mask, PD), the region idle."""
        mr = self._h_mr(h_mr)
        m = checks.mr_mod_mask(mask)
        checks.check_mr_idle(mr.windows, mr.shares)
        pd = self._h_pd(h_pd) if m & int(MrModMask.PD) else mr.pd
        return mr, m, pd

    def _rereg_region(self, h_mr: Any, mask: MrModMask, buffer: Any, vaddr: int | None,
                      access: AccessFlags | None,
                      h_pd: Any) -> tuple[Any, Any, int, memoryview | None]:
        """``modify_mr``'s checks: (MR, PD, new access bits, new byte view or ``None``)."""
        mr, m, pd = self._rereg_target(h_mr, mask, h_pd)
        acc, mv = checks.check_reregistration(
            m, buffer, vaddr, access, int(mr.access), self._readonly(mr), self._lim
        )
        return mr, pd, acc, mv

    def _bind_region(self, bind: Any, mw: Any, qp: Any) -> tuple[Any, int]:
        """``bind_mw``'s region (``None``: an unbind) and the window's remote access bits."""
        if not bind.length:
            return None, 0
        mr = self._h_mr(bind.mr)
        return mr, checks.check_bind_region(bind, int(mr.access), mr.vaddr, mr.length,
                                            mr.pd is qp.pd and mw.pd is qp.pd)

    def _modify_target(self, h_qp: Any, mod: QpMod) -> Any:
        """``modify_qp``'s QP, with ``mod`` a transition its state table allows."""
        qp = self._h_qp(h_qp)
        if not isinstance(mod, QpMod):
            raise InvalidParameter("modify_qp needs a QpMod")
        qp_fsm.check_modify(qp.qp_type, qp.state, mod)
        return qp

    def _take_cq(self, h_ca: Any, size: int) -> None:
        """``create_cq``'s checks and count: an open CA, a size, room for a CQ."""
        self._h_ca(h_ca)
        checks.check_cq_size(size, self._lim)
        self._check_count("cq", self._lim.max_cqs)
        self._adopt("cq")

    @staticmethod
    def _keys_of(mr: Any, handle: Any = None) -> MrKeys:
        """What registering ``mr`` returns (``handle``: an FMR mapping it, else ``mr``)."""
        return MrKeys(mr if handle is None else handle, mr.lkey, mr.rkey, mr.vaddr, mr.length)

    # ------------------------------------------------------- the shared verbs
    @shared
    def create_srq(self, h_pd: Any, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        pd = self._h_pd(h_pd)
        checks.check_srq_attr(attr, self._lim)
        self._check_count("srq", self._lim.max_srqs)
        srq = self._make_srq(pd, attr, srq_context)
        self._adopt("srq", pd)
        return SrqCreated(srq, SrqAttr(srq.max_wr, srq.max_sge, srq.limit))

    @shared
    def modify_srq(self, h_srq: Any, attr: SrqAttr, mask: SrqAttrMask) -> None:
        srq = self._h_srq(h_srq)
        srq.max_wr = checks.srq_depth_after(attr, mask, srq.max_wr, len(srq.wqes), self._lim)
        if int(mask) & int(SrqAttrMask.LIMIT):
            srq.limit = attr.srq_limit

    @shared
    def query_srq(self, h_srq: Any) -> SrqAttr:
        srq = self._h_srq(h_srq)
        return SrqAttr(srq.max_wr, srq.max_sge, srq.limit)

    @shared
    def query_av(self, h_av: Any) -> AvAttr:
        return cast(AvAttr, self._h_av(h_av).attr)

    @shared
    def resize_cq(self, h_cq: Any, size: int) -> int:
        cq = self._h_cq(h_cq)
        checks.check_cq_resize(size, len(cq.entries), self._lim)
        cq.size = size
        if cq.notify_n > size:
            cq.notify_n = size
        return size

    @shared
    def query_cq(self, h_cq: Any) -> int:
        return int(self._h_cq(h_cq).size)

    @shared
    def query_mr(self, h_mr: Any) -> MrAttr:
        mr = self._h_mr(h_mr)
        return checks.mr_attr(mr.vaddr, mr.length, int(mr.access), mr.lkey, mr.rkey)

    @shared
    def query_mw(self, h_mw: Any) -> int:
        return int(self._h_mw(h_mw).rkey)

    @shared
    def unmap_fmr(self, h_fmr: Any) -> None:
        fmr = self._h_fmr(h_fmr)
        self._drop_mapping(fmr)
        fmr.maps = 0

    @shared
    def dealloc_fmr(self, h_fmr: Any) -> None:
        fmr = self._h_fmr(h_fmr)
        if fmr.mr is not None:
            raise ResourceBusy("the FMR is mapped: unmap it first")
        self._retire("mr", fmr, fmr.pd)  # an FMR holds a region entry
