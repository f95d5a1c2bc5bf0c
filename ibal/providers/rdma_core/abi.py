"""The libibverbs structures this provider reads or writes itself, as ctypes.

``<infiniband/verbs.h>`` makes the data path ``static inline``: every
compiled verbs program fills ``ibv_send_wr``/``ibv_recv_wr``/``ibv_sge`` and
reads ``ibv_wc`` itself and calls through ``ibv_context.ops``, so these
layouts are libibverbs' ABI.  They are declared here once, field by field as
in the header, and every offset the provider uses comes from them
(``tests/providers/rdma_core/test_abi.py`` compares them with a C program
compiled against the installed header).  The hot path still packs with
:mod:`struct`: :func:`layout` turns a list of fields into a ``struct``
format with the padding the C compiler put between them.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

_P = ctypes.c_void_p
_U8, _U16, _U32, _U64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
_INT, _UINT = ctypes.c_int, ctypes.c_uint


class IbvSge(ctypes.Structure):
    _fields_ = [("addr", _U64), ("length", _U32), ("lkey", _U32)]


class _Rdma(ctypes.Structure):
    _fields_ = [("remote_addr", _U64), ("rkey", _U32)]


class _Atomic(ctypes.Structure):
    _fields_ = [("remote_addr", _U64), ("compare_add", _U64), ("swap", _U64), ("rkey", _U32)]


class _Ud(ctypes.Structure):
    _fields_ = [("ah", _P), ("remote_qpn", _U32), ("remote_qkey", _U32)]


class _Wr(ctypes.Union):
    _fields_ = [("rdma", _Rdma), ("atomic", _Atomic), ("ud", _Ud)]


class _Xrc(ctypes.Structure):
    _fields_ = [("remote_srqn", _U32)]


class _QpTypeU(ctypes.Union):
    _fields_ = [("xrc", _Xrc)]


class _MwBindInfo(ctypes.Structure):
    _fields_ = [("mr", _P), ("addr", _U64), ("length", _U64), ("mw_access_flags", _UINT)]


class _BindMw(ctypes.Structure):
    _fields_ = [("mw", _P), ("rkey", _U32), ("bind_info", _MwBindInfo)]


class _Tso(ctypes.Structure):
    _fields_ = [("hdr", _P), ("hdr_sz", _U16), ("mss", _U16)]


class _Tail(ctypes.Union):
    _fields_ = [("bind_mw", _BindMw), ("tso", _Tso)]


class IbvSendWr(ctypes.Structure):
    _fields_ = [
        ("wr_id", _U64),
        ("next", _P),
        ("sg_list", _P),
        ("num_sge", _INT),
        ("opcode", _UINT),  # enum ibv_wr_opcode
        ("send_flags", _UINT),
        ("imm_data", _U32),  # union with invalidate_rkey; big-endian on the wire
        ("wr", _Wr),
        ("qp_type", _QpTypeU),
        ("tail", _Tail),  # the anonymous bind_mw / tso union
    ]


class IbvRecvWr(ctypes.Structure):
    _fields_ = [("wr_id", _U64), ("next", _P), ("sg_list", _P), ("num_sge", _INT)]


class IbvWc(ctypes.Structure):
    _fields_ = [
        ("wr_id", _U64),
        ("status", _UINT),  # enum ibv_wc_status
        ("opcode", _UINT),  # enum ibv_wc_opcode
        ("vendor_err", _U32),
        ("byte_len", _U32),
        ("imm_data", _U32),  # union with invalidated_rkey
        ("qp_num", _U32),
        ("src_qp", _U32),
        ("wc_flags", _UINT),
        ("pkey_index", _U16),
        ("slid", _U16),
        ("sl", _U8),
        ("dlid_path_bits", _U8),
    ]


_OPS_SLOTS = (
    "_compat_query_device",
    "_compat_query_port",
    "_compat_alloc_pd",
    "_compat_dealloc_pd",
    "_compat_reg_mr",
    "_compat_rereg_mr",
    "_compat_dereg_mr",
    "alloc_mw",
    "bind_mw",
    "dealloc_mw",
    "_compat_create_cq",
    "poll_cq",
    "req_notify_cq",
    "_compat_cq_event",
    "_compat_resize_cq",
    "_compat_destroy_cq",
    "_compat_create_srq",
    "_compat_modify_srq",
    "_compat_query_srq",
    "_compat_destroy_srq",
    "post_srq_recv",
    "_compat_create_qp",
    "_compat_query_qp",
    "_compat_modify_qp",
    "_compat_destroy_qp",
    "post_send",
    "post_recv",
    "_compat_create_ah",
    "_compat_destroy_ah",
    "_compat_attach_mcast",
    "_compat_detach_mcast",
    "_compat_async_event",
)


class IbvContextOps(ctypes.Structure):
    """``struct ibv_context_ops``: function pointers, held as plain addresses."""

    _fields_ = [(name, _P) for name in _OPS_SLOTS]


class IbvContext(ctypes.Structure):
    """The head of ``struct ibv_context`` (``mutex`` and what follows are not needed)."""

    _fields_ = [
        ("device", _P),
        ("ops", IbvContextOps),
        ("cmd_fd", _INT),
        ("async_fd", _INT),
        ("num_comp_vectors", _INT),
    ]


class IbvCompChannel(ctypes.Structure):
    _fields_ = [("context", _P), ("fd", _INT), ("refcnt", _INT)]


class IbvCq(ctypes.Structure):
    """The head of ``struct ibv_cq``."""

    _fields_ = [("context", _P), ("channel", _P), ("cq_context", _P), ("handle", _U32)]


class IbvQp(ctypes.Structure):
    """The head of ``struct ibv_qp``."""

    _fields_ = [
        ("context", _P),
        ("qp_context", _P),
        ("pd", _P),
        ("send_cq", _P),
        ("recv_cq", _P),
        ("srq", _P),
        ("handle", _U32),
        ("qp_num", _U32),
    ]


class IbvMr(ctypes.Structure):
    _fields_ = [
        ("context", _P),
        ("pd", _P),
        ("addr", _P),
        ("length", ctypes.c_size_t),
        ("handle", _U32),
        ("lkey", _U32),
        ("rkey", _U32),
    ]


class IbvMw(ctypes.Structure):
    _fields_ = [
        ("context", _P),
        ("pd", _P),
        ("rkey", _U32),
        ("handle", _U32),
        ("type", _UINT),  # enum ibv_mw_type
    ]


_CODES: dict[Any, str] = {
    _U8: "B", _U16: "H", _U32: "I", _U64: "Q", _INT: "i", _UINT: "I", _P: "Q",
}  # fmt: skip


def field_of(cls: type[ctypes.Structure], path: str) -> tuple[int, type]:
    """Offset and ctypes type of the dotted ``path`` (``"wr.rdma.rkey"``) in ``cls``."""
    offset = 0
    ctype: type = cls
    for name in path.split("."):
        desc = getattr(ctype, name)
        offset += desc.offset
        ctype = dict(ctype._fields_)[name]  # type: ignore[attr-defined]
    return offset, ctype


def offset(cls: type[ctypes.Structure], path: str) -> int:
    return field_of(cls, path)[0]


def layout(
    parts: Sequence[tuple[type[ctypes.Structure], Sequence[str]]], *, whole: bool = False
) -> struct.Struct:
    """A little-endian ``struct`` for the given fields of consecutive structures.

    Each part is a structure and the fields of it to pack, in offset order;
    the structures follow one another (the next one starts at the previous
    one's ``sizeof``), as a work request and its scatter entry do in one slot.
    ``whole``: pad to the end of the last structure (for arrays of it).
    """
    fmt = "<"
    pos = 0
    base = 0
    for cls, paths in parts:
        for path in paths:
            off, ctype = field_of(cls, path)
            off += base
            if off < pos:
                raise ValueError(f"{cls.__name__}.{path} overlaps the field before it")
            fmt += f"{off - pos}x" if off > pos else ""
            fmt += _CODES[ctype]
            pos = off + ctypes.sizeof(ctype)
        base += ctypes.sizeof(cls)
    if whole and base > pos:
        fmt += f"{base - pos}x"
    return struct.Struct(fmt)


__all__ = [
    "IbvCompChannel",
    "IbvContext",
    "IbvContextOps",
    "IbvCq",
    "IbvQp",
    "IbvRecvWr",
    "IbvSendWr",
    "IbvSge",
    "IbvWc",
    "field_of",
    "layout",
    "offset",
]
