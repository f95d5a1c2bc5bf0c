"""A fast constructor for :class:`ibal.types.Wc`, shared by the providers' engines.

The frozen dataclass ``__init__`` is the slowest part of making a completion;
``make_wc`` sets the slots directly and falls back to the dataclass if its
fields ever change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from ibal.types import NetworkHeader, RecvOpt, Wc, WcStatus, WcType

_NO_OPT = RecvOpt.NONE

_WC_FIELDS = (
    "wr_id", "wc_type", "status", "length", "imm", "recv_opt", "qp_num",
    "src_qp", "slid", "sl", "pkey_index", "path_bits", "vendor_err", "grh",
    "network_header", "invalidated_rkey",
)  # fmt: skip


def _wc_maker() -> Callable[..., Wc]:
    """A fast ``Wc`` constructor (the frozen dataclass ``__init__`` is the slowest
    part of a completion).  Falls back to the dataclass when its fields change."""
    if tuple(f.name for f in fields(Wc)) != _WC_FIELDS:  # pragma: no cover
        return Wc
    new = object.__new__
    (s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) = (
        Wc.__dict__[name].__set__ for name in _WC_FIELDS
    )

    def make(
        wr_id: int, wc_type: WcType, status: WcStatus, length: int = 0, imm: int | None = None,
        recv_opt: RecvOpt = _NO_OPT, qp_num: int = 0, src_qp: int = 0, slid: int = 0,
        sl: int = 0, pkey_index: int = 0, path_bits: int = 0, vendor_err: int = 0,
        grh: bytes | None = None, network_header: NetworkHeader | None = None,
        invalidated_rkey: int | None = None,
    ) -> Wc:
        w: Wc = new(Wc)
        s0(w, wr_id)
        s1(w, wc_type)
        s2(w, status)
        s3(w, length)
        s4(w, imm)
        s5(w, recv_opt)
        s6(w, qp_num)
        s7(w, src_qp)
        s8(w, slid)
        s9(w, sl)
        s10(w, pkey_index)
        s11(w, path_bits)
        s12(w, vendor_err)
        s13(w, grh)
        s14(w, network_header)
        s15(w, invalidated_rkey)
        return w

    return make


make_wc = _wc_maker()
