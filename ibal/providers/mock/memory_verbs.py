"""Memory regions (virtual, physical, shared) and type 1 memory windows.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ibal.ci.interface import (
    Handle,
    MwCreated,
)
from ibal.providers import checks
from ibal.providers.mock.objects import (
    MockMr,
    MockMw,
    SendWqe,
)
from ibal.status import (
    InvalidParameter,
    InvalidPermission,
)
from ibal.types import (
    AccessFlags,
    BindWr,
    MrKeys,
    MrModMask,
    PhysCreate,
    QpType,
    WrType,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    FENCE,
    PAGE_SIZES,
    SIGNALED,
    CaState,
    verb,
)

_ACCESS: Final = int(MrModMask.ACCESS)
_ADDR_OR_ACCESS: Final = int(MrModMask.ADDR | MrModMask.ACCESS)


def _pages_readonly(mr: MockMr) -> bool:
    """Whether any of the region's pages is a read-only buffer."""
    return (mr.mv is not None and mr.mv.readonly) or any(p.readonly for p in mr.pages)


class MemoryVerbs(CaState):
    """Memory regions (virtual, physical, shared) and type 1 memory windows."""

    def _readonly(self, mr: MockMr) -> bool:
        return _pages_readonly(mr)

    def _install_keys(self, mr: MockMr, acc: int, key: int | None = None) -> None:
        key = self._new_key() if key is None else key
        mr.lkey = key
        mr.rkey = key if acc & checks.REMOTE else 0
        mr.access = AccessFlags(acc)
        mr.acc = acc
        self.keys[key] = mr

    @verb
    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd, acc, mv = self._region_parts(h_pd, buffer, vaddr, access)
        mr = MockMr(self, pd)
        mr.vaddr = vaddr
        mr.length = mv.nbytes
        mr.mv = mv
        self._install_keys(mr, acc)
        self._adopt("mr", pd)
        return self._keys_of(mr)

    def _alloc_iova(self, size: int, align: int) -> int:
        base = (self._iova + align - 1) & ~(align - 1)
        self._iova = base + ((size + align - 1) & ~(align - 1)) + align  # a guard page
        return base

    def _page(self, page: object, ps: int, acc: int) -> memoryview:
        mv = checks.byte_view(page, acc)
        if mv.nbytes < ps:
            raise InvalidParameter(f"a page buffer is shorter than {ps} bytes")
        return mv[:ps]

    def _phys_pages(self, create: PhysCreate, acc: int) -> tuple[memoryview, ...]:
        """The pages of a physical registration, checked against the CA."""
        ps = create.page_size
        if ps not in PAGE_SIZES:
            raise InvalidParameter(f"page size {ps} not supported (4 KiB .. 2 MiB, powers of 2)")
        if not create.pages:
            raise InvalidParameter("no pages")
        if not 0 <= create.buf_offset < ps:
            raise InvalidParameter("buf_offset must lie inside the first page")
        if create.length <= 0 or create.buf_offset + create.length > len(create.pages) * ps:
            raise InvalidParameter("length does not fit the pages")
        if create.length > self.limits.max_mr_size:
            raise InvalidParameter(f"{create.length} bytes is above max_mr_size")
        return tuple(self._page(page, ps, acc) for page in create.pages)

    def _phys_vaddr(self, create: PhysCreate, vaddr: int) -> int:
        """The address a physical region gets: ``vaddr`` if its in-page offset matches."""
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        ps = create.page_size
        if vaddr and vaddr % ps == create.buf_offset:
            return vaddr
        return self._alloc_iova(create.buf_offset + create.length, ps) + create.buf_offset

    @staticmethod
    def _set_phys(mr: MockMr, create: PhysCreate, pages: tuple[memoryview, ...],
                  vaddr: int) -> None:
        mr.vaddr = vaddr
        mr.length = create.length
        mr.mv = None
        mr.pages = pages
        mr.page_size = create.page_size
        mr.base = create.buf_offset
        mr.phys = True

    @verb
    def register_pmr(self, h_pd: Handle, create: PhysCreate, vaddr: int) -> MrKeys:
        pd = self._h_pd(h_pd)
        if not isinstance(create, PhysCreate):
            raise InvalidParameter("register_pmr needs a PhysCreate")
        acc = checks.check_access(create.access)
        pages = self._phys_pages(create, acc)
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        mr = MockMr(self, pd)
        self._set_phys(mr, create, pages, self._phys_vaddr(create, vaddr))
        self._install_keys(mr, acc)
        self._adopt("mr", pd)
        return self._keys_of(mr)

    @verb
    def modify_pmr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        create: PhysCreate | None,
        vaddr: int,
        h_pd: Handle | None,
    ) -> MrKeys:
        mr, m, pd = self._rereg_target(h_mr, mask, h_pd)
        if m & _ADDR_OR_ACCESS and not isinstance(create, PhysCreate):
            raise InvalidParameter("modify_pmr needs a PhysCreate unless only the PD changes")
        acc = checks.check_access(create.access) if create and m & _ACCESS else mr.acc
        pages: tuple[memoryview, ...] | None = None
        if create and m & int(MrModMask.ADDR):
            pages = self._phys_pages(create, acc)
            assigned = self._phys_vaddr(create, vaddr)
        elif acc & checks.ANY_WRITE and _pages_readonly(mr):
            raise InvalidPermission("write access requested on read-only pages")
        # apply: a deregistration and a physical registration, with new keys
        del self.keys[mr.lkey]
        self._repin(mr, pd)
        if create and pages is not None:
            self._set_phys(mr, create, pages, assigned)
            self._unshare(mr)
        self._install_keys(mr, acc, self._rekey(mr.lkey))
        return self._keys_of(mr)

    @verb
    def modify_mr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Handle | None,
    ) -> MrKeys:
        mr, pd, acc, mv = self._rereg_region(h_mr, mask, buffer, vaddr, access, h_pd)
        # apply: a deregistration and a registration, with new keys
        del self.keys[mr.lkey]
        self._repin(mr, pd)
        if mv is not None:
            assert vaddr is not None
            mr.mv = mv
            mr.pages = ()
            mr.page_size = 0
            mr.base = 0
            mr.phys = False
            mr.vaddr = vaddr
            mr.length = mv.nbytes
            self._unshare(mr)
        self._install_keys(mr, acc, self._rekey(mr.lkey))
        return self._keys_of(mr)

    @verb
    def register_smr(self, h_mr: Handle, h_pd: Handle, access: AccessFlags, vaddr: int) -> MrKeys:
        src = self._h_mr(h_mr)
        pd = self._h_pd(h_pd)
        acc = checks.check_shared(access, _pages_readonly(src), vaddr)
        self._check_count("mr", self.limits.max_mrs)
        mr = MockMr(self, pd)
        mr.vaddr = checks.shared_vaddr(vaddr, src.vaddr, src.page_size or 4096)
        mr.length = src.length
        mr.mv = src.mv
        mr.pages = src.pages
        mr.page_size = src.page_size
        mr.base = src.base
        mr.phys = src.phys
        mr.parent = src
        src.shares += 1
        self._install_keys(mr, acc)
        self._adopt("mr", pd)
        return self._keys_of(mr)

    @verb
    def deregister_mr(self, h_mr: Handle) -> None:
        mr = self._h_mr(h_mr)
        checks.check_mr_idle(mr.windows, mr.shares)
        self._retire("mr", mr, mr.pd)
        del self.keys[mr.lkey]
        self._unshare(mr)
        mr.mv = None
        mr.pages = ()

    # ==================================================================== MW
    @verb
    def create_mw(self, h_pd: Handle, mw_type: int = 1) -> MwCreated:
        pd = self._h_pd(h_pd)
        checks.check_mw_type(mw_type)
        self._check_count("mw", self.limits.max_mws)
        mw = MockMw(self, pd, self._new_key(), mw_type)
        self.keys[mw.rkey] = mw
        self._adopt("mw", pd)
        return MwCreated(mw, mw.rkey)

    def _unbind(self, mw: MockMw) -> None:
        if mw.mr is not None:
            mw.mr.windows -= 1
            mw.mr = None
        mw.addr = mw.length = 0
        mw.access = AccessFlags.NONE
        mw.acc = 0
        mw.valid = mw.mw_type == 1
        mw.qp = None

    def bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        fab = self._engine
        try:
            with fab.lock:
                if fab.verb_faults_armed:
                    fab.faults.check_verb("bind_mw", self)
                rkey = self._bind_mw(h_mw, h_qp, bind)
                if fab.runs_inline:
                    fab.drive()
                return rkey
        finally:
            if fab.upcalls:
                fab.flush_upcalls()

    def _bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        mw = self._h_mw(h_mw)
        qp = self._h_qp(h_qp)
        checks.check_bind(bind, qp.qp_type, qp.transport is not QpType.UD, qp.state,
                          len(qp.sq) >= qp.caps.sq_depth, mw.mw_type, mw.rkey)
        mr: MockMr | None
        mr, acc = self._bind_region(bind, mw, qp)
        # Type 1 binds take effect when posted; the WQE gives the completion in order.
        old = mw.rkey
        new = self._rekey(old)
        del self.keys[old]
        self._unbind(mw)
        if mr is not None:
            mw.mr = mr
            mr.windows += 1
            mw.addr = bind.addr
            mw.length = bind.length
            mw.access = AccessFlags(acc)
            mw.acc = acc
        mw.rkey = new
        self.keys[new] = mw
        opt = int(bind.send_opt)
        wqe = SendWqe(bind.wr_id, WrType.SEND, bool(opt & SIGNALED) or qp.sq_signaled)
        wqe.bind = (mw, mr, bind.addr, bind.length, AccessFlags(acc), new)
        wqe.fence = bool(opt & FENCE)
        qp.sq.append(wqe)
        self._engine.sq_progress(qp)
        return new

    @verb
    def destroy_mw(self, h_mw: Handle) -> None:
        mw = self._h_mw(h_mw)
        self._unbind(mw)
        self._retire("mw", mw, mw.pd)
        del self.keys[mw.rkey]
