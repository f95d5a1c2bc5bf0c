"""libibverbs numbers and their ibal counterparts.

The values are the ABI of ``<infiniband/verbs.h>`` (stable since the first
libibverbs); keeping them here as plain ints lets the translation run, and be
tested, without pyverbs.  ``tests/providers/rdma_core`` checks them against
``pyverbs.enums`` where pyverbs is importable.
"""

from __future__ import annotations

from ibal.types import (
    AccessFlags,
    ApmState,
    AsyncEvent,
    AtomicCap,
    GidType,
    LinkLayer,
    LinkState,
    Mtu,
    QpState,
    QpType,
    WcStatus,
    WcType,
)

# ------------------------------------------------------------------ QP types/states
IBV_QPT_RC = 2
IBV_QPT_UC = 3
IBV_QPT_UD = 4

QPT_TO_IBV: dict[QpType, int] = {
    QpType.RC: IBV_QPT_RC,
    QpType.UC: IBV_QPT_UC,
    QpType.UD: IBV_QPT_UD,
}
QPT_FROM_IBV: dict[int, QpType] = {v: k for k, v in QPT_TO_IBV.items()}

IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR = (
    range(7)
)
QPS_TO_IBV: dict[QpState, int] = {
    QpState.RESET: IBV_QPS_RESET,
    QpState.INIT: IBV_QPS_INIT,
    QpState.RTR: IBV_QPS_RTR,
    QpState.RTS: IBV_QPS_RTS,
    QpState.SQD: IBV_QPS_SQD,
    QpState.SQERR: IBV_QPS_SQE,
    QpState.ERROR: IBV_QPS_ERR,
}
QPS_FROM_IBV: dict[int, QpState] = {v: k for k, v in QPS_TO_IBV.items()}

# ibv_qp_attr_mask
IBV_QP_STATE = 1 << 0
IBV_QP_CUR_STATE = 1 << 1
IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2
IBV_QP_ACCESS_FLAGS = 1 << 3
IBV_QP_PKEY_INDEX = 1 << 4
IBV_QP_PORT = 1 << 5
IBV_QP_QKEY = 1 << 6
IBV_QP_AV = 1 << 7
IBV_QP_PATH_MTU = 1 << 8
IBV_QP_TIMEOUT = 1 << 9
IBV_QP_RETRY_CNT = 1 << 10
IBV_QP_RNR_RETRY = 1 << 11
IBV_QP_RQ_PSN = 1 << 12
IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13
IBV_QP_ALT_PATH = 1 << 14
IBV_QP_MIN_RNR_TIMER = 1 << 15
IBV_QP_SQ_PSN = 1 << 16
IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17
IBV_QP_PATH_MIG_STATE = 1 << 18
IBV_QP_CAP = 1 << 19
IBV_QP_DEST_QPN = 1 << 20
IBV_QP_ALL_ATTRS = (1 << 21) - 1

IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED = range(3)
APM_TO_IBV: dict[ApmState, int] = {
    ApmState.MIGRATED: IBV_MIG_MIGRATED,
    ApmState.REARM: IBV_MIG_REARM,
    ApmState.ARMED: IBV_MIG_ARMED,
}
APM_FROM_IBV: dict[int, ApmState] = {v: k for k, v in APM_TO_IBV.items()}

# ------------------------------------------------------------------ access flags
IBV_ACCESS_LOCAL_WRITE = 1
IBV_ACCESS_REMOTE_WRITE = 2
IBV_ACCESS_REMOTE_READ = 4
IBV_ACCESS_REMOTE_ATOMIC = 8
IBV_ACCESS_MW_BIND = 16
IBV_ACCESS_ZERO_BASED = 32

_ACCESS_PAIRS = (
    (AccessFlags.LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE),
    (AccessFlags.RDMA_WRITE, IBV_ACCESS_REMOTE_WRITE),
    (AccessFlags.RDMA_READ, IBV_ACCESS_REMOTE_READ),
    (AccessFlags.ATOMIC, IBV_ACCESS_REMOTE_ATOMIC),
    (AccessFlags.MW_BIND, IBV_ACCESS_MW_BIND),
)
_ALL_IBAL_ACCESS = 0
for _a, _ in _ACCESS_PAIRS:
    _ALL_IBAL_ACCESS |= int(_a)


def access_to_ibv(access: AccessFlags | int) -> int:
    """``ib_access_t`` bits as ``ibv_access_flags``; ValueError for unknown bits."""
    a = int(access)
    if a & ~_ALL_IBAL_ACCESS:
        raise ValueError(f"unknown access bits {a & ~_ALL_IBAL_ACCESS:#x}")
    out = 0
    for ibal, ibv in _ACCESS_PAIRS:
        if a & ibal:
            out |= ibv
    return out


def access_from_ibv(flags: int) -> AccessFlags:
    out = AccessFlags.NONE
    for ibal, ibv in _ACCESS_PAIRS:
        if flags & ibv:
            out |= ibal
    return out


# ------------------------------------------------------------------ work requests
IBV_WR_RDMA_WRITE = 0
IBV_WR_RDMA_WRITE_WITH_IMM = 1
IBV_WR_SEND = 2
IBV_WR_SEND_WITH_IMM = 3
IBV_WR_RDMA_READ = 4
IBV_WR_ATOMIC_CMP_AND_SWP = 5
IBV_WR_ATOMIC_FETCH_AND_ADD = 6
IBV_WR_LOCAL_INV = 7
IBV_WR_BIND_MW = 8
IBV_WR_SEND_WITH_INV = 9

IMM_OPCODES = frozenset({IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND_WITH_IMM})

IBV_SEND_FENCE = 1
IBV_SEND_SIGNALED = 2
IBV_SEND_SOLICITED = 4
IBV_SEND_INLINE = 8

# ------------------------------------------------------------------ completions
IBV_WC_SEND = 0
IBV_WC_RDMA_WRITE = 1
IBV_WC_RDMA_READ = 2
IBV_WC_COMP_SWAP = 3
IBV_WC_FETCH_ADD = 4
IBV_WC_BIND_MW = 5
IBV_WC_LOCAL_INV = 6
IBV_WC_RECV = 128
IBV_WC_RECV_RDMA_WITH_IMM = 129

IBV_WC_GRH = 1
IBV_WC_WITH_IMM = 2
IBV_WC_WITH_INV = 1 << 3
KERNEL_WC_WITH_INVALIDATE = 1 << 2
"""The kernel's ``IB_WC_WITH_INVALIDATE``: kernel rxe (6.1) copies its kernel
``wc_flags`` to user space unchanged, so there bit 2 (libibverbs'
``IBV_WC_IP_CSUM_OK``) means "with invalidate" and bit 3 is the kernel's
``IB_WC_IP_CSUM_OK``."""

WC_OPCODE_TO_TYPE: dict[int, WcType] = {
    IBV_WC_SEND: WcType.SEND,
    IBV_WC_RDMA_WRITE: WcType.RDMA_WRITE,
    IBV_WC_RDMA_READ: WcType.RDMA_READ,
    IBV_WC_COMP_SWAP: WcType.COMPARE_SWAP,
    IBV_WC_FETCH_ADD: WcType.FETCH_ADD,
    IBV_WC_BIND_MW: WcType.MW_BIND,
    IBV_WC_LOCAL_INV: WcType.LOCAL_INV,
    IBV_WC_RECV: WcType.RECV,
    IBV_WC_RECV_RDMA_WITH_IMM: WcType.RECV_RDMA_WRITE,
}

# ibv_wc_status -> ib_wc_status_t.  RD/EEC-only and tag-matching codes, which
# no ibal QP type can produce, are GENERAL_ERR; so is any code not listed.
WC_STATUS_FROM_IBV: dict[int, WcStatus] = {
    0: WcStatus.SUCCESS,
    1: WcStatus.LOCAL_LEN_ERR,  # IBV_WC_LOC_LEN_ERR
    2: WcStatus.LOCAL_OP_ERR,  # IBV_WC_LOC_QP_OP_ERR
    3: WcStatus.LOCAL_OP_ERR,  # IBV_WC_LOC_EEC_OP_ERR
    4: WcStatus.LOCAL_PROTECTION_ERR,  # IBV_WC_LOC_PROT_ERR
    5: WcStatus.WR_FLUSHED_ERR,  # IBV_WC_WR_FLUSH_ERR
    6: WcStatus.MEM_WINDOW_BIND_ERR,  # IBV_WC_MW_BIND_ERR
    7: WcStatus.BAD_RESP_ERR,  # IBV_WC_BAD_RESP_ERR
    8: WcStatus.LOCAL_ACCESS_ERR,  # IBV_WC_LOC_ACCESS_ERR
    9: WcStatus.REM_INVALID_REQ_ERR,  # IBV_WC_REM_INV_REQ_ERR
    10: WcStatus.REM_ACCESS_ERR,  # IBV_WC_REM_ACCESS_ERR
    11: WcStatus.REM_OP_ERR,  # IBV_WC_REM_OP_ERR
    12: WcStatus.TIMEOUT_RETRY_ERR,  # IBV_WC_RETRY_EXC_ERR
    13: WcStatus.RNR_RETRY_ERR,  # IBV_WC_RNR_RETRY_EXC_ERR
    14: WcStatus.GENERAL_ERR,  # IBV_WC_LOC_RDD_VIOL_ERR (RD)
    15: WcStatus.REM_INVALID_REQ_ERR,  # IBV_WC_REM_INV_RD_REQ_ERR
    16: WcStatus.REM_OP_ERR,  # IBV_WC_REM_ABORT_ERR
    17: WcStatus.GENERAL_ERR,  # IBV_WC_INV_EECN_ERR (RD)
    18: WcStatus.GENERAL_ERR,  # IBV_WC_INV_EEC_STATE_ERR (RD)
    19: WcStatus.GENERAL_ERR,  # IBV_WC_FATAL_ERR
    20: WcStatus.TIMEOUT_RETRY_ERR,  # IBV_WC_RESP_TIMEOUT_ERR
    21: WcStatus.GENERAL_ERR,  # IBV_WC_GENERAL_ERR
    22: WcStatus.GENERAL_ERR,  # IBV_WC_TM_ERR (tag matching)
    23: WcStatus.GENERAL_ERR,  # IBV_WC_TM_RNDV_INCOMPLETE (tag matching)
}

# ------------------------------------------------------------------ async events
# ibv_event_type -> (ib_async_event_t, which object the element names)
EV_CQ, EV_QP, EV_SRQ, EV_PORT, EV_CA = "cq", "qp", "srq", "port", "ca"
EVENT_FROM_IBV: dict[int, tuple[AsyncEvent, str]] = {
    0: (AsyncEvent.CQ_ERROR, EV_CQ),  # IBV_EVENT_CQ_ERR
    1: (AsyncEvent.QP_FATAL, EV_QP),  # IBV_EVENT_QP_FATAL
    2: (AsyncEvent.WQ_REQ_ERROR, EV_QP),  # IBV_EVENT_QP_REQ_ERR
    3: (AsyncEvent.WQ_ACCESS_ERROR, EV_QP),  # IBV_EVENT_QP_ACCESS_ERR
    4: (AsyncEvent.QP_COMM, EV_QP),  # IBV_EVENT_COMM_EST
    5: (AsyncEvent.SQ_DRAINED, EV_QP),  # IBV_EVENT_SQ_DRAINED
    6: (AsyncEvent.QP_APM, EV_QP),  # IBV_EVENT_PATH_MIG
    7: (AsyncEvent.QP_APM_ERROR, EV_QP),  # IBV_EVENT_PATH_MIG_ERR
    8: (AsyncEvent.LOCAL_FATAL, EV_CA),  # IBV_EVENT_DEVICE_FATAL
    9: (AsyncEvent.PORT_ACTIVE, EV_PORT),  # IBV_EVENT_PORT_ACTIVE
    10: (AsyncEvent.PORT_DOWN, EV_PORT),  # IBV_EVENT_PORT_ERR
    11: (AsyncEvent.LID_CHANGE, EV_PORT),  # IBV_EVENT_LID_CHANGE
    12: (AsyncEvent.PKEY_CHANGE, EV_PORT),  # IBV_EVENT_PKEY_CHANGE
    13: (AsyncEvent.SM_CHANGE, EV_PORT),  # IBV_EVENT_SM_CHANGE
    14: (AsyncEvent.SRQ_CATAS_ERROR, EV_SRQ),  # IBV_EVENT_SRQ_ERR
    15: (AsyncEvent.SRQ_LIMIT_REACHED, EV_SRQ),  # IBV_EVENT_SRQ_LIMIT_REACHED
    16: (AsyncEvent.SRQ_QP_LAST_WQE_REACHED, EV_QP),  # IBV_EVENT_QP_LAST_WQE_REACHED
    17: (AsyncEvent.CLIENT_REREGISTER, EV_PORT),  # IBV_EVENT_CLIENT_REREGISTER
    18: (AsyncEvent.GID_CHANGE, EV_PORT),  # IBV_EVENT_GID_CHANGE
    # 19 IBV_EVENT_WQ_FATAL concerns a WQ, which ibal has no object for.
}

# ------------------------------------------------------------------ device/port
IBV_DEVICE_AUTO_PATH_MIG = 1 << 4
IBV_DEVICE_BAD_PKEY_CNTR = 1 << 1
IBV_DEVICE_BAD_QKEY_CNTR = 1 << 2
IBV_DEVICE_SYS_IMAGE_GUID = 1 << 11
IBV_DEVICE_N_NOTIFY_CQ = 1 << 14
IBV_DEVICE_MEM_WINDOW = 1 << 17
IBV_DEVICE_MEM_MGT_EXTENSIONS = 1 << 21
IBV_DEVICE_MEM_WINDOW_TYPE_2A = 1 << 23
IBV_DEVICE_MEM_WINDOW_TYPE_2B = 1 << 24

IBV_MW_TYPE_1 = 1
IBV_MW_TYPE_2 = 2

IBV_SRQ_MAX_WR = 1
IBV_SRQ_LIMIT = 2

IBV_LINK_LAYER_INFINIBAND = 1
IBV_LINK_LAYER_ETHERNET = 2

IBV_GID_TYPE_IB = 0
IBV_GID_TYPE_ROCE_V1 = 1
IBV_GID_TYPE_ROCE_V2 = 2
GID_TYPE_FROM_IBV = {
    IBV_GID_TYPE_IB: GidType.IB,
    IBV_GID_TYPE_ROCE_V1: GidType.ROCE_V1,
    IBV_GID_TYPE_ROCE_V2: GidType.ROCE_V2,
}

ATOMIC_FROM_IBV: dict[int, AtomicCap] = {0: AtomicCap.NONE, 1: AtomicCap.LOCAL, 2: AtomicCap.GLOBAL}

LINK_STATE_FROM_IBV: dict[int, LinkState] = {
    0: LinkState.NO_CHANGE,
    1: LinkState.DOWN,
    2: LinkState.INIT,
    3: LinkState.ARMED,
    4: LinkState.ACTIVE,
    5: LinkState.ACT_DEFER,
}

LINK_LAYER_FROM_IBV: dict[int, LinkLayer] = {
    IBV_LINK_LAYER_ETHERNET: LinkLayer.ETHERNET,
    IBV_LINK_LAYER_INFINIBAND: LinkLayer.INFINIBAND,
    0: LinkLayer.INFINIBAND,  # IBV_LINK_LAYER_UNSPECIFIED: legacy IB drivers
}

WIDTH_FROM_IBV: dict[int, str] = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
SPEED_FROM_IBV: dict[int, str] = {
    1: "2.5 Gbps",
    2: "5.0 Gbps",
    4: "10.0 Gbps",
    8: "10.0 Gbps",  # FDR10
    16: "14.0 Gbps",
    32: "25.0 Gbps",
    64: "50.0 Gbps",
    128: "100.0 Gbps",
}
# PortInfo.VLCap encoding -> number of data VLs
VLS_FROM_IBV: dict[int, int] = {1: 1, 2: 2, 3: 4, 4: 8, 5: 15}


def mtu_from_ibv(value: int) -> Mtu | None:
    try:
        return Mtu(value)
    except ValueError:
        return None
