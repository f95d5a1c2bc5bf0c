"""Argument checks the software providers' verbs share (the mock and rxe).

Both CAs judge a verb's arguments by the same IBA rules and must answer a bad
one with the same :mod:`ibal.status` exception and message, so the
conformance suite sees one behaviour; one copy keeps them from drifting.
Pure functions of the arguments and the CA's limits (any object with the
``CaAttr`` limit fields: the mock's ``CaLimits`` or an ``ibal.types.CaAttr``).
They raise and return; each provider keeps its own objects and applies the
result itself.  The post verbs keep their checks inline: there they are
interleaved with building each provider's work queue entry, per WR.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Final, Protocol, TypeVar

from ibal.status import (
    InsufficientResources,
    InvalidCqSize,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidParameter,
    InvalidPermission,
    InvalidQpState,
    InvalidRkey,
    InvalidServiceType,
    InvalidSetting,
    InvalidSrqHandle,
    Overflow,
    ResourceBusy,
    Status,
    Unsupported,
    post_error,
)
from ibal.types import (
    AccessFlags,
    BindWr,
    MrAttr,
    MrModMask,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    UdDest,
)

REMOTE: Final = int(AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
LOCAL_WRITE: Final = int(AccessFlags.LOCAL_WRITE)
MW_BIND: Final = int(AccessFlags.MW_BIND)
NEEDS_LOCAL_WRITE: Final = int(AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
ANY_WRITE: Final = int(AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
ALL_ACCESS: Final = REMOTE | LOCAL_WRITE | MW_BIND

QP_RANGES: Final = (
    ("dest_qp", 0xFFFFFF),
    ("rq_psn", 0xFFFFFF),
    ("sq_psn", 0xFFFFFF),
    ("rnr_nak_timeout", 31),
    ("local_ack_timeout", 31),
    ("retry_cnt", 7),
    ("rnr_retry_cnt", 7),
    ("qkey", 0xFFFFFFFF),
)
"""``QpMod`` fields with a fixed wire width: (name, largest value)."""

_SRQ_MASK: Final = int(SrqAttrMask.MAX_WR | SrqAttrMask.LIMIT)
_MR_MASK: Final = int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS)
_BIND_STATES: Final = (QpState.RTS, QpState.SQD)


class Limits(Protocol):
    """The CA limits the checks read (fields of ``ibal.types.CaAttr``)."""

    @property
    def max_wrs(self) -> int: ...
    @property
    def max_sges(self) -> int: ...
    @property
    def max_inline(self) -> int: ...
    @property
    def max_cqes(self) -> int: ...
    @property
    def max_srq_wrs(self) -> int: ...
    @property
    def max_srq_sges(self) -> int: ...
    @property
    def max_mr_size(self) -> int: ...
    @property
    def max_qp_resp_res(self) -> int: ...
    @property
    def max_qp_init_depth(self) -> int: ...


# ------------------------------------------------------------------------ CQ
def check_cq_size(size: int, lim: Limits) -> None:
    """``InvalidCqSize`` unless ``size`` is 1..``max_cqes``."""
    if not isinstance(size, int) or not 1 <= size <= lim.max_cqes:
        raise InvalidCqSize(f"CQ size must be 1..{lim.max_cqes}")


def check_cq_resize(size: int, held: int, lim: Limits) -> None:
    """``resize_cq`` to ``size`` with ``held`` completions queued: ``check_cq_size``, and
    ``Overflow`` when they would not fit."""
    check_cq_size(size, lim)
    if size < held:
        raise Overflow(f"the CQ holds {held} entries, more than {size}")


# ------------------------------------------------------------------------ QP
def check_create_qp(qp_type: QpType, makes: Container[QpType], rd_reason: str,
                    srq_pd: object, pd: object) -> None:
    """The QP type ``create_qp`` is asked for and the SRQ's PD (``None``: no SRQ)."""
    if srq_pd is not None and srq_pd is not pd:
        raise InvalidSrqHandle("the SRQ belongs to another protection domain")
    if qp_type is QpType.RD:
        raise Unsupported(f"RD QPs: {rd_reason}")
    if qp_type not in makes:
        raise InvalidServiceType(f"create_qp does not make {qp_type!r} QPs")


def check_qp_caps(caps: QpCaps, lim: Limits, has_srq: bool) -> None:
    """Queue depths, SGE counts and inline size against the CA (no RQ with an SRQ)."""
    if not isinstance(caps, QpCaps):
        raise InvalidParameter("QP capabilities missing")
    if not 0 <= caps.sq_depth <= lim.max_wrs or (
        not has_srq and not 0 <= caps.rq_depth <= lim.max_wrs
    ):
        raise InvalidMaxWrs(f"queue depth above {lim.max_wrs} (or negative)")
    if not 0 <= caps.sq_sge <= lim.max_sges or (
        not has_srq and not 0 <= caps.rq_sge <= lim.max_sges
    ):
        raise InvalidMaxSge(f"SGE count above {lim.max_sges} (or negative)")
    if not 0 <= caps.max_inline <= lim.max_inline:
        raise InvalidSetting(f"inline size above {lim.max_inline}")


def next_qpn(start: int, in_use: Container[int]) -> int:
    """The first free 24-bit QP number from ``start`` on (0 and 1 are the special QPs)."""
    qpn = start
    while qpn in in_use or qpn < 2:
        qpn = (qpn + 1) & 0xFFFFFF
    return qpn


def check_qp_values(mod: QpMod, lim: Limits) -> None:
    """The ``modify_qp`` values every CA judges alike: field widths, RDMA depths, access."""
    for name, top in QP_RANGES:
        value = getattr(mod, name)
        if value is not None and not 0 <= value <= top:
            raise InvalidParameter(f"{name} {value} out of range 0..{top}")
    if mod.resp_res is not None and not 0 <= mod.resp_res <= lim.max_qp_resp_res:
        raise InvalidSetting(f"resp_res above {lim.max_qp_resp_res}")
    if mod.init_depth is not None and not 0 <= mod.init_depth <= lim.max_qp_init_depth:
        raise InvalidSetting(f"init_depth above {lim.max_qp_init_depth}")
    if mod.access is not None and int(mod.access) & ~ALL_ACCESS:
        raise InvalidParameter(f"unknown access bits in {mod.access!r}")


# ----------------------------------------------------------------------- SRQ
def check_srq_attr(attr: SrqAttr, lim: Limits) -> None:
    """What ``create_srq`` is asked for."""
    if not isinstance(attr, SrqAttr):
        raise InvalidParameter("SRQ attributes missing")
    if not 1 <= attr.max_wr <= lim.max_srq_wrs:
        raise InvalidMaxWrs(f"SRQ depth must be 1..{lim.max_srq_wrs}")
    if not 0 <= attr.max_sge <= lim.max_srq_sges:
        raise InvalidMaxSge(f"SRQ SGE count must be 0..{lim.max_srq_sges}")
    if not 0 <= attr.srq_limit <= attr.max_wr:
        raise InvalidSetting("SRQ limit above its depth")


def srq_depth_after(attr: SrqAttr, mask: SrqAttrMask, max_wr: int, posted: int,
                    lim: Limits) -> int:
    """The depth an SRQ of ``max_wr`` holding ``posted`` WRs has after ``modify_srq``."""
    m = int(mask)
    if not m or m & ~_SRQ_MASK or attr is None:
        raise InvalidParameter(f"bad SRQ attribute mask {mask!r}")
    if m & int(SrqAttrMask.MAX_WR):
        if not max(1, posted) <= attr.max_wr <= lim.max_srq_wrs:
            raise InvalidSetting(
                f"SRQ depth {attr.max_wr}: below the {posted} posted or above the CA"
            )
        max_wr = attr.max_wr
    if m & int(SrqAttrMask.LIMIT) and not 0 <= attr.srq_limit <= max_wr:
        raise InvalidSetting(f"SRQ limit {attr.srq_limit} above its depth {max_wr}")
    return max_wr


# ------------------------------------------------------------------------ MR
def check_access(access: Any) -> int:
    """Validated access bits as an int; ``InvalidParameter``/``InvalidPermission``."""
    try:
        acc = int(access)
    except (TypeError, ValueError):
        raise InvalidParameter(f"bad access flags {access!r}") from None
    if acc < 0 or acc & ~ALL_ACCESS:
        raise InvalidParameter(f"unknown access bits in {access!r}")
    if acc & NEEDS_LOCAL_WRITE and not acc & LOCAL_WRITE:
        raise InvalidPermission("remote write and atomic access need local write")
    return acc


def byte_view(buffer: Any, acc: int) -> memoryview:
    """The consumer's buffer as a flat byte view; checks contiguity and writability.

    Always a view of our own, so a deregistration may release it.
    """
    try:
        mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        if not mv.contiguous:
            raise InvalidParameter("the buffer is not contiguous")
        mv = mv.cast("B")
    except TypeError:
        raise InvalidParameter(f"{type(buffer).__name__} is not a buffer") from None
    except ValueError as e:  # a released memoryview, a closed mmap
        raise InvalidParameter(f"the {type(buffer).__name__} is not usable: {e}") from None
    if mv.readonly and acc & ANY_WRITE:
        raise InvalidPermission("write access requested on a read-only buffer")
    return mv


def check_region(buffer: Any, vaddr: int, access: Any, lim: Limits) -> tuple[int, memoryview]:
    """``register_mr``'s buffer, address and access: (access bits, byte view)."""
    if buffer is None:
        raise InvalidParameter("register_mr needs a buffer")
    acc = check_access(access)
    mv = byte_view(buffer, acc)
    if mv.nbytes > lim.max_mr_size:
        raise InvalidParameter(f"{mv.nbytes} bytes is above max_mr_size")
    if not isinstance(vaddr, int) or vaddr < 0 or vaddr + mv.nbytes > 1 << 64:
        raise InvalidParameter(f"virtual address {vaddr!r} out of range")
    return acc, mv


def mr_mod_mask(mask: MrModMask) -> int:
    """``modify_mr``'s mask as an int: some of ADDR, PD, ACCESS and nothing else."""
    m = int(mask)
    if not m or m & ~_MR_MASK:
        raise InvalidParameter(f"bad re-registration mask {mask!r}")
    return m


def check_mr_idle(windows: int, shares: int) -> None:
    """A region is re-registered or deregistered only with no window or share on it."""
    if windows:
        raise ResourceBusy(f"{windows} memory window(s) bound to the region")
    if shares:
        raise ResourceBusy(f"{shares} shared region(s) use its pages")


def check_reregistration(m: int, buffer: Any, vaddr: int | None, access: Any, acc: int,
                         readonly: bool, lim: Limits) -> tuple[int, memoryview | None]:
    """``modify_mr``'s new access and buffer: (access bits, new view or ``None``).

    ``acc`` is the region's access now; ``readonly`` whether its pages are.
    """
    if m & int(MrModMask.ACCESS):
        if access is None:
            raise InvalidParameter("MrModMask.ACCESS without access flags")
        acc = check_access(access)
    mv: memoryview | None = None
    if m & int(MrModMask.ADDR):
        if buffer is None or vaddr is None:
            raise InvalidParameter("MrModMask.ADDR needs a buffer and an address")
        mv = byte_view(buffer, acc)
        if mv.nbytes > lim.max_mr_size:
            raise InvalidParameter("the new region is above max_mr_size")
        if vaddr < 0 or vaddr + mv.nbytes > 1 << 64:
            raise InvalidSetting(f"virtual address {vaddr!r} out of range")
    elif acc & ANY_WRITE and readonly:
        raise InvalidPermission("write access requested on a read-only buffer")
    return acc, mv


def check_shared(access: Any, readonly: bool, vaddr: int) -> int:
    """``register_smr``'s access (on pages that may be read-only) and address."""
    acc = check_access(access)
    if acc & ANY_WRITE and readonly:
        raise InvalidPermission("write access requested on read-only pages")
    if not isinstance(vaddr, int) or vaddr < 0:
        raise InvalidParameter(f"virtual address {vaddr!r} out of range")
    return acc


def shared_vaddr(vaddr: int, src_vaddr: int, page: int) -> int:
    """A shared region's address: ``vaddr`` moved to the source's offset in the page."""
    if not vaddr:
        return src_vaddr
    return vaddr - vaddr % page + src_vaddr % page


def mr_attr(vaddr: int, length: int, access: int, lkey: int, rkey: int) -> MrAttr:
    """What ``query_mr`` reports: remote bounds only for a region with an R_Key."""
    remote = bool(rkey)
    return MrAttr(
        local_lb=vaddr,
        local_ub=vaddr + length,
        remote_lb=vaddr if remote else 0,
        remote_ub=vaddr + length if remote else 0,
        access=AccessFlags(access),
        lkey=lkey,
        rkey=rkey,
    )


# ------------------------------------------------------------------------ MW
def check_mw_type(mw_type: int) -> None:
    """Windows are of type 1 or 2."""
    if mw_type not in (1, 2):
        raise InvalidParameter(f"no memory window type {mw_type!r}")


def check_bind(bind: BindWr, qp_type: QpType, connected: bool, state: QpState, sq_full: bool,
               mw_type: int, mw_rkey: int) -> None:
    """``bind_mw`` before the region: QP, work request and window (type 1 windows only)."""
    if not connected:
        raise InvalidServiceType(f"{qp_type.name} QPs cannot bind memory windows")
    if not isinstance(bind, BindWr):
        raise InvalidParameter("bind_mw needs a BindWr")
    if mw_type != 1:
        raise InvalidParameter("a type 2 window is bound by a BIND_MW work request")
    if bind.current_rkey != mw_rkey:
        raise InvalidRkey(f"current_rkey 0x{bind.current_rkey:x} is not the window's 0x{mw_rkey:x}")
    if state not in _BIND_STATES:
        raise InvalidQpState(f"bind_mw on a QP in {state.name}")
    if sq_full:
        raise InsufficientResources("send queue full")


def check_bind_region(bind: BindWr, mr_acc: int, mr_vaddr: int, mr_length: int,
                      one_pd: bool) -> int:
    """A window's range and rights within its region: the window's remote access bits.

    ``one_pd``: window, region and QP share a protection domain.
    """
    try:
        acc = int(bind.access) & REMOTE
    except (TypeError, ValueError):
        raise InvalidParameter(f"bad access {bind.access!r}") from None
    if not mr_acc & MW_BIND:
        raise InvalidPermission("the region was not registered with MW_BIND")
    if acc & NEEDS_LOCAL_WRITE and not mr_acc & LOCAL_WRITE:
        raise InvalidPermission("remote write/atomic windows need a locally writable MR")
    if bind.length < 0 or bind.addr < mr_vaddr or bind.addr + bind.length > mr_vaddr + mr_length:
        raise InvalidParameter("the window does not lie inside the region")
    if not one_pd:
        raise InvalidParameter("window, region and QP must share a protection domain")
    return acc


_W = TypeVar("_W")
_R = TypeVar("_R")
_A = TypeVar("_A")


def check_ud_wr(wr: SendWr, i: int, ca: object, name: str, av_cls: type[_A]) -> tuple[UdDest, _A]:
    """A datagram send's destination at post time (entry ``i``): ``wr.ud`` and its
    AV, a live one of CA ``ca`` (whether its PD is the QP's is the caller's)."""
    ud = wr.ud
    if ud is None:
        raise post_error(Status.INVALID_PARAMETER, i, "a datagram send needs wr.ud")
    av = ud.av
    if (type(av) is not av_cls or getattr(av, "ca", None) is not ca
            or not getattr(av, "alive", False)):
        raise post_error(Status.INVALID_AV_HANDLE, i, f"not an AV of {name}")
    return ud, av


def check_bind_wr(wr: SendWr, i: int, ca: object, name: str, mw_cls: type[_W],
                  mr_cls: type[_R]) -> tuple[_W, _R | None, int]:
    """A type 2 ``BIND_MW`` work request's shape at post time (entry ``i``): the
    window and region, both of CA ``ca``, and the window's remote access bits."""
    mw, bind = wr.mw, wr.bind
    if type(mw) is not mw_cls or getattr(mw, "ca", None) is not ca:
        raise post_error(Status.INVALID_PARAMETER, i, f"BIND_MW: not a window of {name}")
    if not isinstance(bind, BindWr):
        raise post_error(Status.INVALID_PARAMETER, i, "BIND_MW needs wr.bind (a BindWr)")
    mr = bind.mr
    if mr is not None and (type(mr) is not mr_cls or getattr(mr, "ca", None) is not ca):
        raise post_error(Status.INVALID_PARAMETER, i, f"BIND_MW: not a region of {name}")
    return mw, mr, int(bind.access) & REMOTE


def type2_bind_allowed(mw_rkey: int, new_rkey: int, mr_acc: int, mr_vaddr: int,
                       mr_length: int, addr: int, length: int, acc: int) -> bool:
    """IBA 10.6.7.2's checks of a type 2 bind on the region's side, in queue order
    (the window's state and the protection domains are the caller's)."""
    if new_rkey & ~0xFF != mw_rkey & ~0xFF or new_rkey == mw_rkey:
        return False  # only the key byte may change, and it must
    if not mr_acc & MW_BIND:
        return False
    if acc & NEEDS_LOCAL_WRITE and not mr_acc & LOCAL_WRITE:
        return False
    return length > 0 and mr_vaddr <= addr and addr + length <= mr_vaddr + mr_length
