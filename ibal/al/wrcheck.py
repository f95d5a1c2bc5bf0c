"""Type checks of work requests before they reach a provider.

Providers may assume what the contract types say (a ``SendWr`` with ``Sge``
entries of ints); a wrong object must come back as an ibal status, not as an
``AttributeError`` from inside a provider, and must never be queued.  Numeric
fields must also fit their wire widths (:mod:`ibal.al.ranges`): a key of
2**32 would otherwise stop a provider that packs it, or be truncated by one
that does not.  One pass over the list, a few attribute loads per request;
opcodes and lengths against the CA's limits stay the provider's to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ibal.al import ranges
from ibal.status import PostError, Status, post_error
from ibal.types import BASE_WR_TYPES, BindWr, RecvWr, SendWr, Sge, UdDest, WrType


def as_list(wrs: Any, cls: type) -> Sequence[Any]:
    """``wrs`` as a sequence of work requests (one ``cls`` is a list of one)."""
    if type(wrs) is list or type(wrs) is tuple:
        return wrs
    if isinstance(wrs, cls):
        return (wrs,)
    if isinstance(wrs, Sequence) and not isinstance(wrs, (str, bytes, bytearray, memoryview)):
        return wrs
    raise post_error(
        Status.INVALID_PARAMETER, 0, f"expected {cls.__name__} or a list of them, not {wrs!r:.60}"
    )


def _ints(*values: object) -> bool:
    return all(isinstance(v, int) for v in values)


def _sgl_problem(sgl: Any) -> str | None:
    if (
        type(sgl) is not list
        and type(sgl) is not tuple
        and (not isinstance(sgl, Sequence) or isinstance(sgl, (str, bytes, bytearray, memoryview)))
    ):
        return f"sg_list is {type(sgl).__name__}, not a list of Sge"
    for g in sgl:
        if type(g) is not Sge and not isinstance(g, Sge):
            return f"sg_list holds {type(g).__name__}, not Sge"
        if not _ints(g.addr, g.length, g.lkey):
            return "Sge addr, length and lkey must be ints"
    return ranges.sgl_problem(sgl)


def _send_problem(wr: Any) -> str | None:
    if type(wr) is not SendWr and not isinstance(wr, SendWr):
        return f"{type(wr).__name__} is not a SendWr"
    if not _ints(
        wr.wr_id, wr.opcode, wr.send_opt, wr.imm, wr.remote_addr, wr.rkey, wr.compare_add, wr.swap
    ):
        return "wr_id, opcode, send_opt, imm, remote_addr, rkey, compare_add, swap must be ints"
    if not _ints(wr.invalidate_rkey):
        return "invalidate_rkey must be an int"
    if wr.opcode == WrType.BIND_MW:
        b = wr.bind
        if wr.mw is None or not isinstance(b, BindWr):
            return "BIND_MW needs mw and bind (a BindWr)"
        if not _ints(b.addr, b.length, b.access):
            return "bind addr, length and access must be ints"
    ud = wr.ud
    if ud is not None and (
        not isinstance(ud, UdDest) or not _ints(ud.remote_qp, ud.remote_qkey, ud.pkey_index)
    ):
        return "ud must be a UdDest with int remote_qp, remote_qkey and pkey_index"
    return _sgl_problem(wr.sg_list) or ranges.send_problem(wr)


def _recv_problem(wr: Any) -> str | None:
    if type(wr) is not RecvWr and not isinstance(wr, RecvWr):
        return f"{type(wr).__name__} is not a RecvWr"
    if not _ints(wr.wr_id):
        return "wr_id must be an int"
    if not 0 <= wr.wr_id <= ranges.U64:
        return f"RecvWr.wr_id {wr.wr_id} out of range 0..{ranges.U64:#x}"
    return _sgl_problem(wr.sg_list)


def send_list(wrs: Any) -> tuple[Sequence[SendWr], PostError | None, bool]:
    """``wrs`` as a list, cut before its first malformed request, that request's error,
    and whether the list may hold requests the AL rewrites (datagram or ``INVALIDATE_WR_TYPES``).

    The caller posts the list it gets (the good prefix, as the post contract
    says) and then raises the error.
    """
    wrs = as_list(wrs, SendWr)
    if _plain_sends(wrs):
        return wrs, None, False
    bad = first_bad_send(wrs)
    return (wrs if bad is None else wrs[: bad.failed_index]), bad, True


def recv_list(wrs: Any) -> tuple[Sequence[RecvWr], PostError | None]:
    """The receive twin of :func:`send_list`."""
    wrs = as_list(wrs, RecvWr)
    bad = first_bad_recv(wrs)
    return (wrs if bad is None else wrs[: bad.failed_index]), bad


def _plain_sends(wrs: Sequence[Any]) -> bool:
    """The common case in one tight pass: well-formed, connected, version-1 opcodes."""
    try:  # ``|`` raises TypeError unless ints; a negative or too wide one shifts to nonzero
        for wr in wrs:
            if type(wr) is not SendWr or not isinstance(wr.opcode, int):
                raise TypeError
            if not isinstance(wr.send_opt, int):  # enums: | on them is slow
                raise TypeError
            if (wr.wr_id | wr.remote_addr | wr.compare_add | wr.swap) >> 64 or (
                wr.imm | wr.rkey | wr.invalidate_rkey
            ) >> 32:
                raise TypeError
            sgl = wr.sg_list
            if type(sgl) is not list and type(sgl) is not tuple:
                raise TypeError  # a generator would be used up here
            for g in sgl:
                if type(g) is not Sge or g.addr >> 64 or (g.length | g.lkey) >> 32:
                    raise TypeError
            if wr.ud is not None or wr.opcode > _LAST_BASE:
                raise TypeError  # UD and invalidate/bind requests take the careful path
        return True
    except (TypeError, AttributeError):
        return False


_LAST_BASE = max(BASE_WR_TYPES)


def first_bad_send(wrs: Sequence[Any]) -> PostError | None:
    """The error for the first malformed send work request, or ``None``."""
    if _plain_sends(wrs):
        return None
    for i, wr in enumerate(wrs):
        why = _send_problem(wr)
        if why is not None:
            return post_error(Status.INVALID_PARAMETER, i, f"send WR {i}: {why}")
    return None


def first_bad_recv(wrs: Sequence[Any]) -> PostError | None:
    """The error for the first malformed receive work request, or ``None``."""
    try:
        for wr in wrs:
            if type(wr) is not RecvWr or wr.wr_id >> 64:
                raise TypeError
            sgl = wr.sg_list
            if type(sgl) is not list and type(sgl) is not tuple:
                raise TypeError
            for g in sgl:
                if type(g) is not Sge or g.addr >> 64 or (g.length | g.lkey) >> 32:
                    raise TypeError
        return None
    except (TypeError, AttributeError):
        pass
    for i, wr in enumerate(wrs):
        why = _recv_problem(wr)
        if why is not None:
            return post_error(Status.INVALID_PARAMETER, i, f"recv WR {i}: {why}")
    return None
