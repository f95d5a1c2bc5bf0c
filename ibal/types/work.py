"""Work requests and completions: opcodes, send and receive options, the WR and WC records."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from ibal.records import record
from ibal.types.address import NetworkHeader
from ibal.types.memory import AccessFlags


class SendOpt(enum.IntFlag):
    """`ib_send_opt_t`."""

    NONE = 0
    IMMEDIATE = 0x1
    FENCE = 0x2
    SIGNALED = 0x4
    SOLICITED = 0x8
    INLINE = 0x10
    LOCAL = 0x20


class RecvOpt(enum.IntFlag):
    """`ib_recv_opt_t`; INVALIDATE (verbs' ``IBV_WC_WITH_INV``): ``Wc.invalidated_rkey`` is set."""

    NONE = 0
    IMMEDIATE = 0x1
    FORWARD = 0x2
    GRH_VALID = 0x4
    INVALIDATE = 0x8


class WrType(enum.IntEnum):
    """`ib_wr_type_t`: immediate data is the IMMEDIATE send option, as in IBAL.

    The last three are verbs' (``IBV_WR_*``, same numbers): IBAL has no send
    with invalidate and binds windows only through ``ib_bind_mw``.
    ``SEND_WITH_INV`` and ``LOCAL_INV`` name the key in ``SendWr.invalidate_rkey``;
    ``BIND_MW`` binds a type 2 window (``SendWr.mw``, ``SendWr.bind``) under the
    new R_Key ``SendWr.rkey``.  Providers list them in ``Capabilities.opcodes``.
    """

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMPARE_SWAP = 3
    FETCH_ADD = 4
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9

    @property
    def is_atomic(self) -> bool:
        return self in (WrType.COMPARE_SWAP, WrType.FETCH_ADD)

    @property
    def is_local(self) -> bool:
        """Executed by the local CA alone: nothing goes on the wire."""
        return self is WrType.LOCAL_INV or self is WrType.BIND_MW


BASE_WR_TYPES = frozenset(
    {WrType.SEND, WrType.RDMA_WRITE, WrType.RDMA_READ, WrType.COMPARE_SWAP, WrType.FETCH_ADD}
)
"""The opcodes of contract version 1 (what a CA that says nothing else supports)."""

INVALIDATE_WR_TYPES = frozenset({WrType.SEND_WITH_INV, WrType.LOCAL_INV, WrType.BIND_MW})
"""Send with invalidate, local invalidate, type 2 bind: each provider opts in."""


class WcType(enum.IntEnum):
    """`ib_wc_type_t`."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMPARE_SWAP = 3
    FETCH_ADD = 4
    MW_BIND = 5
    LOCAL_INV = 6
    RECV = 0x80
    RECV_RDMA_WRITE = 0x81


WC_TYPE_FOR_WR: dict[WrType, WcType] = {
    WrType.SEND: WcType.SEND,
    WrType.RDMA_WRITE: WcType.RDMA_WRITE,
    WrType.RDMA_READ: WcType.RDMA_READ,
    WrType.COMPARE_SWAP: WcType.COMPARE_SWAP,
    WrType.FETCH_ADD: WcType.FETCH_ADD,
    WrType.LOCAL_INV: WcType.LOCAL_INV,
    WrType.BIND_MW: WcType.MW_BIND,
    WrType.SEND_WITH_INV: WcType.SEND,
}


class WcStatus(enum.IntEnum):
    """`ib_wc_status_t`."""

    SUCCESS = 0
    LOCAL_LEN_ERR = 1
    LOCAL_OP_ERR = 2
    LOCAL_PROTECTION_ERR = 3
    WR_FLUSHED_ERR = 4
    MEM_WINDOW_BIND_ERR = 5
    REM_ACCESS_ERR = 6
    REM_OP_ERR = 7
    RNR_RETRY_ERR = 8
    TIMEOUT_RETRY_ERR = 9
    REM_INVALID_REQ_ERR = 10
    BAD_RESP_ERR = 11
    LOCAL_ACCESS_ERR = 12
    GENERAL_ERR = 13
    UNMATCHED_RESPONSE = 14
    CANCELED = 15


@record
class Sge:
    """`ib_local_ds_t`: one scatter/gather element in registered memory."""

    addr: int
    length: int
    lkey: int


@record
class UdDest:
    """The datagram part of a send work request.

    ``av`` is an access-layer AV object for consumers; the AL hands providers
    their own AV handle in its place.
    """

    av: Any
    remote_qp: int
    remote_qkey: int = 0
    pkey_index: int = 0


@record
class SendWr:
    """`ib_send_wr_t`; a list of these is what ``post_send`` takes."""

    wr_id: int = 0
    opcode: WrType = WrType.SEND
    sg_list: Sequence[Sge] = ()
    send_opt: SendOpt = SendOpt.SIGNALED
    imm: int = 0
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    ud: UdDest | None = None
    invalidate_rkey: int = 0
    """``SEND_WITH_INV``: the R_Key the receiver invalidates; ``LOCAL_INV``: the local one."""
    mw: Any = None
    """``BIND_MW``: the type 2 window (an AL ``Mw``; the provider's handle below the AL)."""
    bind: BindWr | None = None
    """``BIND_MW``: region, range and access (``mr``, ``addr``, ``length``, ``access``)."""


@record
class RecvWr:
    """`ib_recv_wr_t`."""

    wr_id: int = 0
    sg_list: Sequence[Sge] = ()


@record(frozen=True)
class Wc:
    """`ib_wc_t`: one work completion."""

    wr_id: int
    wc_type: WcType
    status: WcStatus = WcStatus.SUCCESS
    length: int = 0
    imm: int | None = None
    recv_opt: RecvOpt = RecvOpt.NONE
    qp_num: int = 0
    src_qp: int = 0
    slid: int = 0
    sl: int = 0
    pkey_index: int = 0
    path_bits: int = 0
    vendor_err: int = 0
    grh: bytes | None = None
    network_header: NetworkHeader | None = None
    """Datagram receives with ``RecvOpt.GRH_VALID``: what the 40-byte GRH area holds."""
    invalidated_rkey: int | None = None
    """Receives with ``RecvOpt.INVALIDATE``: the R_Key the sender's SEND_WITH_INV invalidated."""


@record
class BindWr:
    """`ib_bind_wr_t`: bind a memory window to ``[addr, addr+length)`` of ``mr``.

    ``mr`` is an access-layer MR for consumers and the provider's MR handle
    below the AL.  ``length == 0`` unbinds.
    """

    mr: Any
    addr: int
    length: int
    access: AccessFlags
    current_rkey: int
    wr_id: int = 0
    send_opt: SendOpt = SendOpt.SIGNALED
