"""Memory regions and memory windows.

``reg_mem`` takes any writable, contiguous Python buffer.  The AL takes the
buffer's real address with ctypes (so ``mr.vaddr`` is what an RDMA peer
targets) and keeps an export of it for the MR's lifetime: a ``bytearray``
cannot be resized while registered, which is this world's "pinning".
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ibal import qp_fsm
from ibal.al.bases import PdBase, QpBase
from ibal.al.obj import CaObject, busy_if, check_handle
from ibal.al.ranges import U64
from ibal.status import (
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPermission,
    InvalidQpState,
    InvalidServiceType,
    Unsupported,
)
from ibal.types import (
    ALL_ACCESS,
    AccessFlags,
    BindWr,
    MrAttr,
    MrKeys,
    MrModMask,
    PhysCreate,
    QpState,
    QpType,
    Sge,
)

if TYPE_CHECKING:
    from ibal.al.cica import CiCa
    from ibal.al.pd import Pd
    from ibal.al.qp import Qp

_MOD_VALID = int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS)
_BIND_STATES = frozenset(s for s in QpState if qp_fsm.sends_execute(s))


def check_access(access: object, cica: CiCa) -> AccessFlags:
    """``access`` as ``AccessFlags`` the CA supports, in a combination IBA allows."""
    if not isinstance(access, int) or isinstance(access, bool) or access & ~int(ALL_ACCESS):
        raise InvalidParameter(f"bad access flags {access!r}")
    flags = AccessFlags(int(access))
    remote_writes = AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC
    if flags & remote_writes and not flags & AccessFlags.LOCAL_WRITE:
        raise InvalidPermission("remote write and atomic access need local write")
    caps = cica.capabilities
    if flags & AccessFlags.ATOMIC and not caps.atomics:
        raise Unsupported(caps.reason("atomics"))
    if flags & AccessFlags.MW_BIND and not caps.mw_types:
        raise Unsupported(caps.reason("mw_types"))
    return flags


def check_phys_create(create: PhysCreate) -> None:
    """The shape of a physical registration (the CA judges page sizes and lengths)."""
    if not create.pages or create.length <= 0 or create.page_size <= 0:
        raise InvalidParameter("pages, page_size and length are required")


def _check_mask(mask: object, given: dict[MrModMask, bool]) -> MrModMask:
    """``mask`` as an ``MrModMask``; each group of bits must come with its argument."""
    if not isinstance(mask, int) or not mask or int(mask) & ~_MOD_VALID:
        raise InvalidParameter(f"bad re-registration mask {mask!r}")
    out = MrModMask(int(mask))
    for bits, present in given.items():
        if bool(out & bits) != present:
            raise InvalidParameter(f"{bits.name} must be given exactly when the mask names it")
    return out


def pin_buffer(buffer: object) -> tuple[memoryview, Any, int]:
    """A byte view of ``buffer``, the ctypes export that pins it, and its address."""
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidParameter(f"{type(buffer).__name__} is not a buffer") from None
    except ValueError as e:  # a released memoryview, a closed mmap
        raise InvalidParameter(f"the {type(buffer).__name__} is not usable: {e}") from None
    if view.readonly:
        raise InvalidParameter("the buffer is read-only")
    if not view.c_contiguous:
        raise InvalidParameter("the buffer is not contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if not view.nbytes:
        raise InvalidParameter("the buffer is empty")
    export = (ctypes.c_char * view.nbytes).from_buffer(view)
    return view, export, ctypes.addressof(export)


class Mr(CaObject):
    """A registered memory region (``ib_reg_mem``, ``ib_reg_phys``, ``ib_reg_shared``,
    ``ib_reg_shmid``)."""

    _invalid = InvalidMrHandle
    _rank = 40
    _kind = "MR"
    _sync_destroy = True

    def __init__(
        self,
        pd: Pd,
        buffer: memoryview | None,
        export: Any,
        access: AccessFlags,
        source: Mr | None = None,
        on_free: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(pd)
        self._pd = pd
        self._buffer = buffer
        self._export = export  # keeps the consumer's buffer exported (pinned)
        self._access = access
        self._source = source
        self._on_free = on_free  # lets go of memory the AL mapped for it (reg_shmid)
        self._bound_mws: dict[Mw, None] = {}
        self.lkey = 0
        self.rkey = 0
        self.vaddr = 0
        self.length = 0

    def _set_keys(self, keys: MrKeys) -> None:
        self._h = keys.handle
        self.lkey, self.rkey = keys.lkey, keys.rkey
        self.vaddr, self.length = keys.vaddr, keys.length

    # ------------------------------------------------------------------ attributes
    @property
    def pd(self) -> Pd:
        return self._pd

    @property
    def buffer(self) -> memoryview | None:
        """The registered bytes (``None`` for a physical registration)."""
        return self._buffer

    @property
    def access(self) -> AccessFlags:
        return self._access

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        """An SGE for ``[offset, offset+length)`` of this region (to its end by default)."""
        self._check()
        if type(offset) is not int or (length is not None and type(length) is not int):
            raise InvalidParameter(f"offset and length are ints: {offset!r:.20}, {length!r:.20}")
        if length is None:
            length = self.length - offset
        if offset < 0 or length < 0 or offset + length > self.length:
            raise InvalidParameter(f"[{offset}, {offset + length}) is outside the region")
        return Sge(self.vaddr + offset, length, self.lkey)

    # ------------------------------------------------------------------ verbs
    def query(self) -> MrAttr:
        """``ib_query_mr``: bounds, access and keys, with ``pd`` filled."""
        self._use()
        try:
            attr = self._ci.query_mr(self._h)
        finally:
            self._unuse()
        return dataclasses.replace(attr, pd=self._pd)

    def rereg(
        self,
        mask: MrModMask,
        *,
        buffer: object = None,
        access: AccessFlags | None = None,
        pd: Pd | None = None,
    ) -> None:
        """``ib_rereg_mem``: change what ``mask`` names; the new keys land on this object."""
        self._check()
        mask = _check_mask(mask, {
            MrModMask.ADDR: buffer is not None,
            MrModMask.ACCESS: access is not None,
            MrModMask.PD: pd is not None,
        })
        new_pd = self._new_pd(pd)
        flags = check_access(access, self._cica) if access is not None else None
        view = export = None
        vaddr: int | None = None
        if buffer is not None:
            view, export, vaddr = pin_buffer(buffer)
        self._reregister(
            lambda h_pd: self._ci.modify_mr(self._h, mask, view, vaddr, flags, h_pd),
            new_pd, flags, view, export,
        )

    def rereg_phys(
        self,
        mask: MrModMask,
        create: PhysCreate | None = None,
        *,
        vaddr: int = 0,
        pd: Pd | None = None,
    ) -> None:
        """``ib_rereg_phys``: re-register as a physical region (``create``'s pages for ADDR,
        its access for ACCESS; ``vaddr`` is the requested address, ``self.vaddr`` the one
        assigned).  Works on virtual and physical regions alike; new keys."""
        self._check()
        if create is not None and not isinstance(create, PhysCreate):
            raise InvalidParameter("a PhysCreate is required")
        mask = _check_mask(mask, {
            MrModMask.ADDR | MrModMask.ACCESS: create is not None,
            MrModMask.PD: pd is not None,
        })
        if type(vaddr) is not int or vaddr < 0:
            raise InvalidParameter("vaddr must be a non-negative int")
        new_pd = self._new_pd(pd)
        flags = None
        export = None
        if create is not None:
            if mask & MrModMask.ACCESS:
                flags = check_access(create.access, self._cica)
            if mask & MrModMask.ADDR:
                check_phys_create(create)
                export = list(create.pages)
        if not self._cica.capabilities.phys_mr:
            raise Unsupported(self._cica.capabilities.reason("phys_mr"))
        self._reregister(
            lambda h_pd: self._ci.modify_pmr(self._h, mask, create, vaddr, h_pd),
            new_pd, flags, None, export, phys=export is not None,
        )

    def _new_pd(self, pd: Pd | None) -> Pd | None:
        if pd is None:
            return None
        return cast("Pd", check_handle(pd, PdBase, self._al, self._cica))

    def _reregister(
        self,
        call: Callable[[Any], MrKeys],
        new_pd: Pd | None,
        flags: AccessFlags | None,
        view: memoryview | None,
        export: Any,
        phys: bool = False,
    ) -> None:
        """Run a re-registration verb (``call(new PD handle or None)``) and take its
        result: keys, memory, access, PD."""
        with self._lock:
            self._check()
            busy_if(self._bound_mws, "bound memory windows")
            if new_pd is not None:
                new_pd._check()
                new_pd._children[self] = None  # pinned before the call, undone on failure
                new_pd._ref("child")
            self._inuse.append(None)  # as _use(), under the lock already
        try:
            keys = call(new_pd.ci_handle if new_pd is not None else None)
        except BaseException:
            if new_pd is not None:
                with self._lock:
                    new_pd._children.pop(self, None)
                new_pd._release("child")
            self._unuse()
            raise
        old_pd = None
        with self._lock:
            self._set_keys(keys)
            if view is not None or phys:
                self._buffer, self._export = view, export
            if flags is not None:
                self._access = flags
            if new_pd is not None:  # re-parent before the verb ends: a cleanup sees the new PD
                old_pd, self._pd, self._parent = self._pd, new_pd, new_pd
                old_pd._children.pop(self, None)
        self._unuse()
        if old_pd is not None:
            old_pd._release("child")

    def reg_shared(self, pd: Pd, access: AccessFlags, vaddr: int = 0) -> Mr:
        """``ib_reg_shared``: a new region on ``pd`` over this region's pages."""
        self._check()
        target = cast("Pd", check_handle(pd, PdBase, self._al, self._cica))
        flags = check_access(access, self._cica)
        if type(vaddr) is not int or vaddr < 0:
            raise InvalidParameter("vaddr must be a non-negative int")
        mr = Mr(target, self._buffer, self._export, flags, source=self)

        def make() -> None:
            mr._set_keys(self._ci.register_smr(self._h, target.ci_handle, flags, vaddr))

        return target._spawn(mr, make, pins=(self,))

    def dereg(self) -> None:
        """``ib_dereg_mr``: synchronous; ``ResourceBusy`` with windows bound or shared regions."""
        self._destroy_now()

    def _check_busy(self) -> None:
        busy_if(self._dependents, "shared memory regions")
        busy_if(self._bound_mws, "bound memory windows")

    def _extra_victims(self) -> list[Mw]:
        return list(self._bound_mws)

    def _cleanup(self) -> None:
        self._ci.deregister_mr(self._h)

    def _after_free(self) -> None:
        if self._on_free is not None:
            self._on_free()

    def _unlink(self) -> None:
        for mw in self._bound_mws:
            mw._bound_mr = None
        self._bound_mws.clear()
        self._export = None
        if self._source is None and self._buffer is not None:
            # Unpin the consumer's buffer (shared regions borrow the owner's view).
            with contextlib.suppress(BufferError):
                self._buffer.release()


class Mw(CaObject):
    """A memory window (``ib_create_mw``); ``bind`` posts a bind on a QP."""

    _invalid = InvalidMwHandle
    _rank = 10
    _kind = "MW"
    _sync_destroy = True

    def __init__(self, pd: Pd, mw_type: int = 1) -> None:
        super().__init__(pd)
        self._pd = pd
        self.mw_type = mw_type
        """1: bound with ``bind``; 2: bound with a ``BIND_MW`` work request (``Qp.post_send``)."""
        self.rkey = 0
        self._bound_mr: Mr | None = None

    @property
    def pd(self) -> Pd:
        return self._pd

    def query(self) -> tuple[Pd, int]:
        """``ib_query_mw``: the PD and the current R_KEY."""
        self._use()
        try:
            self.rkey = self._ci.query_mw(self._h)
        finally:
            self._unuse()
        return self._pd, self.rkey

    def bind(self, qp: Qp, bind: BindWr) -> int:
        """``ib_bind_mw``: bind (``length > 0``) or unbind; returns the new R_KEY."""
        self._check()
        qp = cast("Qp", check_handle(qp, QpBase, self._al, self._cica))
        if self.mw_type != 1:
            raise InvalidParameter("a type 2 window is bound by a BIND_MW work request")
        if not isinstance(bind, BindWr):
            raise InvalidParameter("a BindWr is required")
        if qp.qp_type not in (QpType.RC, QpType.UC):
            raise InvalidServiceType(f"{qp.qp_type.name} QPs cannot bind windows")
        if type(bind.length) is not int or bind.length < 0:
            raise InvalidParameter("length must be a non-negative int")
        if type(bind.wr_id) is not int or not 0 <= bind.wr_id <= U64:
            raise InvalidParameter(f"BindWr.wr_id {bind.wr_id!r:.30} is not a 64-bit int")
        mr: Mr | None = None
        if bind.length or bind.mr is not None:
            mr = check_handle(bind.mr, Mr, self._al, self._cica)
            if mr._pd is not self._pd:
                raise InvalidParameter("the window and the region are on different PDs")
        access: object = bind.access
        if not isinstance(access, int) or isinstance(access, bool) or access & ~int(ALL_ACCESS):
            # A window's rights are remote ones; whether the region allows them
            # (local write under remote write, MW_BIND) is the provider's check.
            raise InvalidParameter(f"bad access flags {access!r}")
        if qp.pd is not self._pd:
            raise InvalidParameter("the window and the QP are on different PDs")
        if qp.state not in _BIND_STATES:
            raise InvalidQpState(f"QP is {qp.state.name}")
        wr = BindWr(
            mr.ci_handle if mr is not None else None,
            bind.addr,
            bind.length,
            bind.access,
            bind.current_rkey,
            bind.wr_id,
            bind.send_opt,
        )
        self._use()
        try:
            rkey = self._ci.bind_mw(self._h, qp.ci_handle, wr)
        finally:
            self._unuse()
        with self._lock:
            if self._bound_mr is not None:
                self._bound_mr._bound_mws.pop(self, None)
            self._bound_mr = mr if bind.length and mr is not None and mr.alive else None
            if self._bound_mr is not None:
                self._bound_mr._bound_mws[self] = None
            self.rkey = rkey
        return rkey

    def destroy(self) -> None:
        """``ib_destroy_mw``: synchronous."""
        self._destroy_now()

    def _cleanup(self) -> None:
        self._ci.destroy_mw(self._h)

    def _unlink(self) -> None:
        if self._bound_mr is not None:
            self._bound_mr._bound_mws.pop(self, None)
            self._bound_mr = None


def set_keys(mr: Mr, keys: MrKeys) -> None:
    """The provider registered ``mr``: its handle, keys and bounds."""
    mr._set_keys(keys)


def forget_export(mr: Mr) -> None:
    """A registration that failed: ``mr`` no longer holds the buffer's export."""
    mr._export = None
