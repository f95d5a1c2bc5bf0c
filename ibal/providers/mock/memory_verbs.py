"""Memory regions (virtual, physical, shared) and type 1 memory windows.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ibal.ci.interface import (
    Handle,
    MwCreated,
)
from ibal.providers.mock.objects import (
    MockMr,
    MockMw,
    SendWqe,
)
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
from ibal.types import (
    AccessFlags,
    BindWr,
    MrAttr,
    MrKeys,
    MrModMask,
    PhysCreate,
    QpType,
    WrType,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    ALL_ACCESS,
    ANY_WRITE,
    FENCE,
    LOCAL_WRITE,
    MW_BIND,
    NEEDS_LOCAL_WRITE,
    PAGE_SIZES,
    REMOTE,
    RTS,
    SIGNALED,
    SQD,
    CaState,
    verb,
)


class MemoryVerbs(CaState):
    """Memory regions (virtual, physical, shared) and type 1 memory windows."""

    @staticmethod
    def _check_access(access: AccessFlags) -> int:
        try:
            acc = int(access)
        except (TypeError, ValueError):
            raise InvalidParameter(f"bad access flags {access!r}") from None
        if acc & ~ALL_ACCESS or acc < 0:
            raise InvalidParameter(f"unknown access bits in {access!r}")
        if acc & NEEDS_LOCAL_WRITE and not acc & LOCAL_WRITE:
            raise InvalidPermission("remote write and atomic access need local write")
        return acc

    @staticmethod
    def _as_bytes_view(buffer: Any, acc: int) -> memoryview:
        try:
            mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        except TypeError:
            raise InvalidParameter(f"{type(buffer).__name__} is not a buffer") from None
        if not mv.contiguous:
            raise InvalidParameter("the buffer is not contiguous")
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if mv.readonly and acc & ANY_WRITE:
            raise InvalidPermission("write access requested on a read-only buffer")
        return mv

    def _install_keys(self, mr: MockMr, acc: int, key: int | None = None) -> None:
        key = self._new_key() if key is None else key
        mr.lkey = key
        mr.rkey = key if acc & REMOTE else 0
        mr.access = AccessFlags(acc)
        mr.acc = acc
        self.keys[key] = mr

    @staticmethod
    def _keys_of(mr: MockMr) -> MrKeys:
        return MrKeys(mr, mr.lkey, mr.rkey, mr.vaddr, mr.length)

    @verb
    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd = self._h_pd(h_pd)
        if buffer is None:
            raise InvalidParameter("register_mr needs a buffer")
        acc = self._check_access(access)
        mv = self._as_bytes_view(buffer, acc)
        length = mv.nbytes
        if length > self.limits.max_mr_size:
            raise InvalidParameter(f"{length} bytes is above max_mr_size")
        if not isinstance(vaddr, int) or vaddr < 0 or vaddr + length > 1 << 64:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        mr = MockMr(self, pd)
        mr.vaddr = vaddr
        mr.length = length
        mr.mv = mv
        self._install_keys(mr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._keys_of(mr)

    def _alloc_iova(self, size: int, align: int) -> int:
        base = (self._iova + align - 1) & ~(align - 1)
        self._iova = base + ((size + align - 1) & ~(align - 1)) + align  # a guard page
        return base

    @verb
    def register_pmr(self, h_pd: Handle, create: PhysCreate, vaddr: int) -> MrKeys:
        pd = self._h_pd(h_pd)
        if not isinstance(create, PhysCreate):
            raise InvalidParameter("register_pmr needs a PhysCreate")
        acc = self._check_access(create.access)
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
        pages = []
        for page in create.pages:
            mv = self._as_bytes_view(page, acc)
            if mv.nbytes < ps:
                raise InvalidParameter(f"a page buffer is shorter than {ps} bytes")
            pages.append(mv[:ps])
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        if vaddr and vaddr % ps == create.buf_offset:
            assigned = vaddr
        else:
            assigned = self._alloc_iova(create.buf_offset + create.length, ps) + create.buf_offset
        mr = MockMr(self, pd)
        mr.vaddr = assigned
        mr.length = create.length
        mr.pages = tuple(pages)
        mr.page_size = ps
        mr.base = create.buf_offset
        mr.phys = True
        self._install_keys(mr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._keys_of(mr)

    @verb
    def query_mr(self, h_mr: Handle) -> MrAttr:
        mr = self._h_mr(h_mr)
        remote = bool(mr.rkey)
        return MrAttr(
            local_lb=mr.vaddr,
            local_ub=mr.vaddr + mr.length,
            remote_lb=mr.vaddr if remote else 0,
            remote_ub=mr.vaddr + mr.length if remote else 0,
            access=mr.access,
            lkey=mr.lkey,
            rkey=mr.rkey,
        )

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
        mr = self._h_mr(h_mr)
        m = int(mask)
        if not m or m & ~int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS):
            raise InvalidParameter(f"bad re-registration mask {mask!r}")
        if mr.windows:
            raise ResourceBusy(f"{mr.windows} memory window(s) bound to the region")
        if mr.shares:
            raise ResourceBusy(f"{mr.shares} shared region(s) use its pages")
        pd = self._h_pd(h_pd) if m & int(MrModMask.PD) else mr.pd
        if m & int(MrModMask.ACCESS):
            if access is None:
                raise InvalidParameter("MrModMask.ACCESS without access flags")
            acc = self._check_access(access)
        else:
            acc = mr.acc
        mv: memoryview | None = None
        if m & int(MrModMask.ADDR):
            if buffer is None or vaddr is None:
                raise InvalidParameter("MrModMask.ADDR needs a buffer and an address")
            mv = self._as_bytes_view(buffer, acc)
            if mv.nbytes > self.limits.max_mr_size:
                raise InvalidParameter("the new region is above max_mr_size")
            if vaddr < 0 or vaddr + mv.nbytes > 1 << 64:
                raise InvalidSetting(f"virtual address {vaddr!r} out of range")
        elif acc & ANY_WRITE and (
            (mr.mv is not None and mr.mv.readonly) or any(p.readonly for p in mr.pages)
        ):
            raise InvalidPermission("write access requested on a read-only buffer")
        # apply: a deregistration and a registration, with new keys
        del self.keys[mr.lkey]
        if pd is not mr.pd:
            mr.pd.users -= 1
            pd.users += 1
            mr.pd = pd
        if mv is not None:
            assert vaddr is not None
            mr.mv = mv
            mr.pages = ()
            mr.page_size = 0
            mr.base = 0
            mr.phys = False
            mr.vaddr = vaddr
            mr.length = mv.nbytes
            if mr.parent is not None:
                mr.parent.shares -= 1
                mr.parent = None
        self._install_keys(mr, acc, self._rekey(mr.lkey))
        return self._keys_of(mr)

    @verb
    def register_smr(self, h_mr: Handle, h_pd: Handle, access: AccessFlags, vaddr: int) -> MrKeys:
        src = self._h_mr(h_mr)
        pd = self._h_pd(h_pd)
        acc = self._check_access(access)
        if acc & ANY_WRITE and (
            (src.mv is not None and src.mv.readonly) or any(p.readonly for p in src.pages)
        ):
            raise InvalidPermission("write access requested on read-only pages")
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        page = src.page_size or 4096
        if not vaddr:
            assigned = src.vaddr
        elif vaddr % page == src.vaddr % page:
            assigned = vaddr
        else:
            assigned = (vaddr - vaddr % page) + src.vaddr % page
        mr = MockMr(self, pd)
        mr.vaddr = assigned
        mr.length = src.length
        mr.mv = src.mv
        mr.pages = src.pages
        mr.page_size = src.page_size
        mr.base = src.base
        mr.phys = src.phys
        mr.parent = src
        src.shares += 1
        self._install_keys(mr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._keys_of(mr)

    @verb
    def deregister_mr(self, h_mr: Handle) -> None:
        mr = self._h_mr(h_mr)
        if mr.windows:
            raise ResourceBusy(f"{mr.windows} memory window(s) bound to the region")
        if mr.shares:
            raise ResourceBusy(f"{mr.shares} shared region(s) use its pages")
        mr.alive = False
        del self.keys[mr.lkey]
        if mr.parent is not None:
            mr.parent.shares -= 1
            mr.parent = None
        mr.mv = None
        mr.pages = ()
        mr.pd.users -= 1
        self._n["mr"] -= 1

    # ==================================================================== MW
    @verb
    def create_mw(self, h_pd: Handle, mw_type: int = 1) -> MwCreated:
        pd = self._h_pd(h_pd)
        if mw_type not in (1, 2):
            raise InvalidParameter(f"no memory window type {mw_type!r}")
        self._check_count("mw", self.limits.max_mws)
        mw = MockMw(self, pd, self._new_key(), mw_type)
        self.keys[mw.rkey] = mw
        self._n["mw"] += 1
        pd.users += 1
        return MwCreated(mw, mw.rkey)

    @verb
    def query_mw(self, h_mw: Handle) -> int:
        return self._h_mw(h_mw).rkey

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
        if qp.transport is QpType.UD:
            raise InvalidServiceType(f"{qp.qp_type.name} QPs cannot bind memory windows")
        if not isinstance(bind, BindWr):
            raise InvalidParameter("bind_mw needs a BindWr")
        if mw.mw_type != 1:
            raise InvalidParameter("a type 2 window is bound by a BIND_MW work request")
        if bind.current_rkey != mw.rkey:
            raise InvalidRkey(
                f"current_rkey 0x{bind.current_rkey:x} is not the window's 0x{mw.rkey:x}"
            )
        if qp.state is not RTS and qp.state is not SQD:
            raise InvalidQpState(f"bind_mw on a QP in {qp.state.name}")
        if len(qp.sq) >= qp.caps.sq_depth:
            raise InsufficientResources("send queue full")
        mr: MockMr | None = None
        acc = 0
        if bind.length:
            mr = self._h_mr(bind.mr)
            try:
                acc = int(bind.access) & REMOTE
            except (TypeError, ValueError):
                raise InvalidParameter(f"bad access {bind.access!r}") from None
            if not mr.acc & MW_BIND:
                raise InvalidPermission("the region was not registered with MW_BIND")
            if acc & NEEDS_LOCAL_WRITE and not mr.acc & LOCAL_WRITE:
                raise InvalidPermission("remote write/atomic windows need a locally writable MR")
            if (
                bind.length < 0
                or bind.addr < mr.vaddr
                or (bind.addr + bind.length > mr.vaddr + mr.length)
            ):
                raise InvalidParameter("the window does not lie inside the region")
            if mr.pd is not qp.pd or mw.pd is not qp.pd:
                raise InvalidParameter("window, region and QP must share a protection domain")
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
        mw.alive = False
        del self.keys[mw.rkey]
        mw.pd.users -= 1
        self._n["mw"] -= 1
