"""Protection domains and what is created on them: AVs, QPs, SRQs, MRs, FMRs, MWs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

from ibal.al import mad_port
from ibal.al import mr as mr_mod
from ibal.al import qp as qp_mod
from ibal.al import srq as srq_mod
from ibal.al.alias import AliasQp
from ibal.al.av import Av, check_av_attr
from ibal.al.bases import PdBase
from ibal.al.cq import Cq
from ibal.al.fmr import EmulatedFmr, Fmr
from ibal.al.mr import Mr, Mw, check_access, check_phys_create, pin_buffer
from ibal.al.obj import DestroyCallback, SyncDestroy, check_callback, check_handle, set_handle
from ibal.al.qp import EventCallback, Qp, QpCreate, check_qp_create
from ibal.al.shmid import open_segment
from ibal.al.srq import Srq, check_srq_attr
from ibal.ci.fmr import check_fmr_create
from ibal.status import (
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidParameter,
    InvalidPort,
    InvalidSetting,
    Unsupported,
)
from ibal.types import AvAttr, FmrCreate, PdType, PhysCreate, QpType, SrqAttr

if TYPE_CHECKING:
    from ibal.al.ca import Ca
    from ibal.types import AccessFlags

_SRQ_QP_TYPES = (QpType.RC, QpType.UC, QpType.UD)
_EMULATED_MAX_PAGES = 1 << 20
"""The most pages an emulated FMR maps (its regions' size is the CA's limit too)."""


class Pd(PdBase):
    """``ib_alloc_pd``'s handle; ``dealloc`` cascades to everything created on it."""

    _rank = 60

    def __init__(self, ca: Ca, pd_type: PdType, context: Any) -> None:
        super().__init__(ca, context)
        self._ca = ca
        self.pd_type = pd_type

    @property
    def ca(self) -> Ca:
        return self._ca

    def dealloc(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_dealloc_pd``: asynchronous; QPs, SRQs, AVs, MRs, FMRs and MWs go first."""
        self._destroy(destroy_cb, wait, timeout)

    def _cleanup(self) -> None:
        self._ci.deallocate_pd(self._h)

    # ------------------------------------------------------------------ AV
    def create_av(self, attr: AvAttr) -> Av:
        """``ib_create_av``."""
        self._check()
        attr = check_av_attr(attr, self._cica)
        av = Av(self)

        def make() -> None:
            set_handle(av, self._ci.create_av(self._h, attr))

        return self._spawn(av, make)

    # ------------------------------------------------------------------ QPs
    def create_qp(
        self,
        create: QpCreate,
        *,
        context: Any = None,
        event_cb: EventCallback | None = None,
    ) -> Qp:
        """``ib_create_qp``: RC, UC, UD or MAD; the QP starts in RESET."""
        self._check()
        cica = self._cica
        create = check_qp_create(create, cica)
        qp_type = QpType(create.qp_type)
        if qp_type.is_special:
            raise InvalidSetting(f"{qp_type.name} QPs come from get_spl_qp")
        send_cq = check_handle(create.send_cq, Cq, self._al, cica)
        recv_cq = check_handle(create.recv_cq, Cq, self._al, cica)
        srq = check_handle(create.srq, Srq, self._al, cica) if create.srq is not None else None
        if srq is not None and qp_type not in _SRQ_QP_TYPES:
            raise InvalidSetting(f"{qp_type.name} QPs cannot use an SRQ")
        check_callback(event_cb, "event_cb")
        caps = cica.capabilities
        provider_type = qp_type
        if qp_type is QpType.MAD and QpType.MAD not in caps.qp_types:
            provider_type = QpType.UD  # a MAD QP is a UD QP the MAD layer drives
        if provider_type not in caps.qp_types:
            raise Unsupported(f"{qp_type.name} QPs: {caps.reason('qp_types')}")
        qp = Qp(self, create, srq, context, event_cb)
        pins: list[Any] = [send_cq, recv_cq] + ([srq] if srq is not None else [])

        def make() -> None:
            created = self._ci.create_qp(
                self._h,
                provider_type,
                create.caps(),
                send_cq.ci_handle,
                recv_cq.ci_handle,
                srq.ci_handle if srq is not None else None,
                bool(create.sq_signaled),
                qp,
            )
            qp_mod.created(qp, created.handle, created.attr)

        return self._spawn(qp, make, pins)

    @overload
    def get_spl_qp(
        self,
        port_guid: int,
        create: QpCreate,
        *,
        context: Any = None,
        event_cb: EventCallback | None = None,
    ) -> Qp: ...

    @overload
    def get_spl_qp(
        self,
        port_guid: int,
        create: QpType,
        *,
        context: Any = None,
        event_cb: EventCallback | None = None,
    ) -> AliasQp: ...

    def get_spl_qp(
        self,
        port_guid: int,
        create: QpCreate | QpType,
        *,
        context: Any = None,
        event_cb: EventCallback | None = None,
    ) -> Qp | AliasQp:
        """``ib_get_spl_qp``: QP0, QP1 or raw QP (``QpCreate``), or an alias QP on the
        port ``port_guid``.

        ``QpType.QP0_ALIAS``/``QP1_ALIAS`` give an :class:`~ibal.al.alias.AliasQp`
        over the port's one QP0/QP1, which the access layer shares among all MAD
        clients (alias QPs use no CQs, so they take the bare type).  A direct
        QP0/QP1 is refused (``ResourceBusy``) while aliases of the port exist,
        and the other way round.
        """
        self._check()
        cica = self._cica
        if isinstance(create, QpType):
            if create not in (QpType.QP0_ALIAS, QpType.QP1_ALIAS):
                raise InvalidSetting(f"{create.name} needs a QpCreate (only alias QPs take a type)")
            return self._get_alias_qp(port_guid, create, context)
        if isinstance(create, QpCreate) and create.qp_type in (QpType.QP0_ALIAS, QpType.QP1_ALIAS):
            raise InvalidSetting("alias QPs use no CQs: pass the QpType alone")
        create = check_qp_create(create, cica)
        qp_type = QpType(create.qp_type)
        if not qp_type.is_special:
            raise InvalidSetting(f"{qp_type.name} is not a special QP type")
        port = cica.port_by_guid(port_guid) if isinstance(port_guid, int) else None
        if port is None:
            raise InvalidPort(f"no port with GUID {port_guid!r} on CA {cica.name}")
        send_cq = check_handle(create.send_cq, Cq, self._al, cica)
        recv_cq = check_handle(create.recv_cq, Cq, self._al, cica)
        if create.srq is not None:
            raise InvalidParameter("special QPs do not use an SRQ")
        check_callback(event_cb, "event_cb")
        caps = cica.capabilities
        if qp_type not in caps.special_qps:
            raise Unsupported(f"{qp_type.name} QPs: {caps.reason('special_qps')}")
        qp = Qp(self, create, None, context, event_cb, port_num=port.port_num)

        def make() -> None:
            created = self._ci.create_spl_qp(
                self._h, port.port_num, qp_type, create.caps(), send_cq.ci_handle,
                recv_cq.ci_handle, qp,
            )
            qp_mod.created(qp, created.handle, created.attr)

        return self._spawn(qp, make, (send_cq, recv_cq))

    def _get_alias_qp(self, port_guid: int, qp_type: QpType, context: Any) -> AliasQp:
        port = self._cica.port_by_guid(port_guid) if isinstance(port_guid, int) else None
        if port is None:
            raise InvalidPort(f"no port with GUID {port_guid!r} on CA {self._cica.name}")
        mad_port.transport_kind(self._cica, 0 if qp_type is QpType.QP0_ALIAS else 1)
        alias = AliasQp(self, qp_type, port.port_num, context)
        return self._spawn(alias, alias._open)

    # ------------------------------------------------------------------ SRQ
    def create_srq(
        self,
        attr: SrqAttr,
        *,
        context: Any = None,
        event_cb: EventCallback | None = None,
    ) -> Srq:
        """``ib_create_srq``."""
        self._check()
        cica = self._cica
        attr = check_srq_attr(attr)
        check_callback(event_cb, "event_cb")
        if not cica.capabilities.srq:
            raise Unsupported(cica.capabilities.reason("srq"))
        max_wr, max_sge = cica.limit("max_srq_wrs"), cica.limit("max_srq_sges")
        if max_wr and attr.max_wr > max_wr:
            raise InvalidMaxWrs(f"max_wr above the CA's {max_wr}")
        if max_sge and attr.max_sge > max_sge:
            raise InvalidMaxSge(f"max_sge above the CA's {max_sge}")
        srq = Srq(self, event_cb, context)

        def make() -> None:
            created = self._ci.create_srq(self._h, attr, srq)
            srq_mod.created(srq, created.handle, created.attr)

        return self._spawn(srq, make)

    # ------------------------------------------------------------------ memory
    def reg_mem(self, buffer: object, access: AccessFlags) -> Mr:
        """``ib_reg_mem``: register a writable buffer; ``mr.vaddr`` is its address."""
        self._check()
        flags = check_access(access, self._cica)
        view, export, vaddr = pin_buffer(buffer)
        mr = Mr(self, view, export, flags)

        def make() -> None:
            mr_mod.set_keys(mr, self._ci.register_mr(self._h, view, vaddr, flags))

        return self._spawn(mr, make)

    def reg_phys(self, create: PhysCreate, vaddr: int = 0) -> Mr:
        """``ib_reg_phys``: pages made contiguous at the I/O address the provider assigns."""
        self._check()
        if not isinstance(create, PhysCreate):
            raise InvalidParameter("a PhysCreate is required")
        if type(vaddr) is not int or vaddr < 0:
            raise InvalidParameter("vaddr must be a non-negative int")
        flags = check_access(create.access, self._cica)
        check_phys_create(create)
        mr = Mr(self, None, list(create.pages), flags)

        def make() -> None:
            mr_mod.set_keys(mr, self._ci.register_pmr(self._h, create, vaddr))

        return self._spawn(mr, make)

    def reg_shmid(self, shmid: str | bytes, access: AccessFlags, length: int | None = None) -> Mr:
        """``ib_reg_shmid``: register the POSIX shared-memory segment named ``shmid``
        (see :mod:`ibal.al.shmid`); every registration of the name, in any process,
        reaches the same pages.  ``mr.buffer`` is this registration's mapping.

        ``length``, if given, must be the segment's size (``InvalidSetting``).
        """
        self._check()
        flags = check_access(access, self._cica)
        seg = open_segment(shmid, length)
        try:
            view, export, vaddr = pin_buffer(seg.buf)
        except BaseException:
            seg.close()
            raise
        mr = Mr(self, view, export, flags, on_free=seg.close)

        def make() -> None:
            mr_mod.set_keys(mr, self._ci.register_mr(self._h, view, vaddr, flags))

        try:
            return self._spawn(mr, make)
        except BaseException:
            mr_mod.forget_export(mr)
            view.release()
            seg.close()
            raise

    def create_fmr(self, create: FmrCreate) -> Fmr:
        """``mlnx_create_fmr``: a fast memory region, not mapped yet (see :mod:`ibal.al.fmr`)."""
        self._check()
        cica = self._cica
        if not isinstance(create, FmrCreate):
            raise InvalidParameter("an FmrCreate is required")
        check_access(create.access, cica)
        native = cica.capabilities.fmr
        if not native:  # the emulation judges the request as a CA would
            check_fmr_create(create, _EMULATED_MAX_PAGES)
            max_size = cica.limit("max_mr_size")
            if max_size and create.max_pages * create.page_size > max_size:
                raise InvalidParameter(f"max_pages x page_size is above max_mr_size {max_size}")
        fmr = Fmr(self, create, native)

        def make() -> None:
            set_handle(fmr, self._ci.alloc_fmr(self._h, create) if native else EmulatedFmr(create))

        return self._spawn(fmr, make)

    def create_mw(self, mw_type: int = 1) -> Mw:
        """``ib_create_mw``: an unbound window; its R_KEY is ``mw.rkey``.

        ``mw_type=2`` (verbs' ``ibv_alloc_mw(IBV_MW_TYPE_2)``): a window bound by a
        ``BIND_MW`` work request and invalidated by ``LOCAL_INV`` or a peer's
        ``SEND_WITH_INV``; ``Unsupported`` unless the CA lists type 2.
        """
        self._check()
        if mw_type not in (1, 2) or type(mw_type) is not int:
            raise InvalidParameter(f"no memory window type {mw_type!r}")
        caps = self._cica.capabilities
        if mw_type not in caps.mw_types:
            raise Unsupported(f"type {mw_type} windows: {caps.reason('mw_types')}")
        mw = Mw(self, mw_type)

        def make() -> None:
            # a CA of contract version 1 takes no type: type 1 is asked the old way
            args = (self._h,) if mw_type == 1 else (self._h, mw_type)
            created = self._ci.create_mw(*args)
            set_handle(mw, created.handle)
            mw.rkey = created.rkey

        return self._spawn(mw, make)
