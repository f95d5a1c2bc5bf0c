"""What an rdma-core device can do through this provider, with the reasons for what it cannot.

Derived from ``ibv_query_device`` where verbs reports it (atomics, SRQ,
memory windows, multicast limits); the rest is what libibverbs/pyverbs 44
offers a user-space process at all, which is the same for every device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.ci.interface import Capabilities
from ibal.providers.rdma_core import consts as C
from ibal.types import BASE_WR_TYPES, INVALIDATE_WR_TYPES, QpType, WrType

SPECIAL_QPS_REASON = (
    "QP0/QP1 are owned by the kernel; MADs go through the MAD-agent verbs (libibumad)"
)

REASONS: dict[str, str] = {
    "special_qps": SPECIAL_QPS_REASON,
    "peek_cq": "verbs has no CQ peek: ibv_poll_cq consumes the entries it reports",
    "rearm_n_cq": (
        "verbs arms a CQ for the next or the next solicited completion only "
        "(ibv_req_notify_cq); there is no arm for N completions"
    ),
    "phys_mr": (
        "physical-page registration is a kernel-only verb (no ibv_reg_phys_mr in user space)"
    ),
    "shared_mr": "libibverbs has no register-shared-region verb",
    "fmr": (
        "Linux removed fast memory regions (5.8) and libibverbs never had them: the "
        "access layer emulates them with ibv_reg_mr/ibv_dereg_mr"
    ),
    "local_mad": (
        "the kernel owns the SMA/GSA of rdma-core devices; MADs go through the "
        "MAD-agent verbs (libibumad)"
    ),
    "vendor_call": "no vendor verbs are exposed through this provider",
    "violation_counters": (
        "P_Key/Q_Key violation counters are reported by query_ca but cannot be reset "
        "from user space (no ibv_modify_port)"
    ),
    "modify_ca": (
        "libibverbs has no ibv_modify_port/ibv_modify_device: port capability bits are "
        "set by kernel agents (ib_cm sets IsCM) and counters reset by the SMA"
    ),
    "apm": (
        "alternate paths are passed to the kernel but automatic path migration is not "
        "exercised or verified through this provider (kernel rxe advertises it and never migrates)"
    ),
    "async_event_injection": "async events come from the kernel; user space cannot raise them",
    "resize_qp": (
        "the kernel's modify-QP accepts IB_QP_CAP in no transition, so work queues keep "
        "the depths granted at creation"
    ),
}

RXE_VENDOR_ID = 0xFFFFFF
"""``RXE_VENDOR_ID`` of the kernel's rdma_rxe (``rxe_param.h``)."""

RXE_DEVIATIONS: dict[str, str] = {
    "precise_local_errors": (
        "kernel rxe completes local protection and length errors (unknown L_Key, L_Key of "
        "another PD, deregistered region, too-small receive) as IBV_WC_LOC_QP_OP_ERR"
    ),
    "mw_bounds_check": (
        "kernel rxe checks an access through a memory window against the region's bounds "
        "only, not the bound window's range"
    ),
    "responder_events": (
        "kernel rxe (6.1) refuses a bad R_Key or a disabled RDMA WRITE with a NAK but raises "
        "no IBV_EVENT_QP_ACCESS_ERR / IBV_EVENT_QP_REQ_ERR on the responder QP"
    ),
    "comm_est": "kernel rxe (6.1) raises no IBV_EVENT_COMM_EST when a QP in RTR receives",
    "last_wqe_reached": (
        "kernel rxe (6.1) raises no IBV_EVENT_QP_LAST_WQE_REACHED when a QP on an SRQ "
        "goes to ERROR"
    ),
    "sqe": "kernel rxe moves a UC/UD QP to ERROR on a send error: it has no SQE state",
    "mw_bind_rkey_index": (
        "kernel rxe (6.1) takes only the key byte of a type 2 BIND_MW's new R_Key and keeps "
        "the window's index: a new R_Key with another index binds instead of failing"
    ),
    "invalidate_nak": (
        "kernel rxe (6.1) completes the receive of a SEND with invalidate naming a key it "
        "cannot invalidate REM_INV_REQ_ERR but acknowledges the SEND: the sender sees SUCCESS"
    ),
}


def is_rxe(dev: Any, name: str) -> bool:
    """Whether the device is kernel rxe (soft RoCE): its vendor id, or an ``rxe`` name."""
    return int(getattr(dev, "vendor_id", 0)) == RXE_VENDOR_ID or name.startswith("rxe")


def build_capabilities(
    dev: Any,
    link_layers: Mapping[int, int],
    multicast_reason: str | None,
    name: str = "",
    mad_agents_reason: str | None = "not probed",
    counters_reason: str | None = "not probed",
) -> Capabilities:
    """The :class:`Capabilities` of one device from its ``ibv_device_attr``.

    ``link_layers`` (port -> ``IBV_LINK_LAYER_*``) is accepted for providers of
    mixed devices; every capability here holds on InfiniBand and RoCE alike.
    ``name`` is the device name; with the vendor id it tells kernel rxe, whose
    deviations (:data:`RXE_DEVIATIONS`) are declared.  ``mad_agents_reason`` is
    why libibumad cannot serve the device (``None``: it can).
    """
    reasons = dict(REASONS)
    if mad_agents_reason is not None:
        reasons["mad_agents"] = mad_agents_reason
    if counters_reason is not None:
        reasons["port_counters"] = counters_reason
    rxe = is_rxe(dev, name)
    flags = int(dev.device_cap_flags)
    atomics = int(dev.atomic_caps) != 0
    if not atomics:
        reasons["atomics"] = "the device reports IBV_ATOMIC_NONE"
    srq = int(dev.max_srq) > 0
    if not srq:
        reasons["srq"] = "the device reports max_srq = 0"
    mw_types: set[int] = set()
    inv_ops: frozenset[WrType] = frozenset()
    type2 = C.IBV_DEVICE_MEM_WINDOW_TYPE_2A | C.IBV_DEVICE_MEM_WINDOW_TYPE_2B
    if flags & C.IBV_DEVICE_MEM_WINDOW and int(dev.max_mw) > 0:
        mw_types.add(1)
        if flags & type2:
            mw_types.add(2)
        else:
            reasons["mw_types"] = "the device reports no IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B"
    else:
        reasons["mw_types"] = "the device does not report IBV_DEVICE_MEM_WINDOW"
    multicast = multicast_reason is None and int(dev.max_mcast_grp) > 0
    if multicast_reason is not None:
        reasons["multicast"] = multicast_reason
    elif not multicast:
        reasons["multicast"] = "the device reports max_mcast_grp = 0"
    if 2 in mw_types and flags & C.IBV_DEVICE_MEM_MGT_EXTENSIONS:
        inv_ops = INVALIDATE_WR_TYPES
    else:
        reasons["opcodes"] = (
            "SEND_WITH_INV, LOCAL_INV and BIND_MW need type 2 windows and "
            "IBV_DEVICE_MEM_MGT_EXTENSIONS"
        )
    rc_ops = (
        BASE_WR_TYPES
        if atomics
        else BASE_WR_TYPES
        - {
            WrType.COMPARE_SWAP,
            WrType.FETCH_ADD,
        }
    )
    return Capabilities(
        qp_types=frozenset({QpType.RC, QpType.UC, QpType.UD}),
        opcodes={
            QpType.RC: rc_ops | inv_ops,
            QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE})
            | (inv_ops - {WrType.SEND_WITH_INV}),
            QpType.UD: frozenset({WrType.SEND}),
        },
        special_qps=frozenset(),
        atomics=atomics,
        mw_types=frozenset(mw_types),
        srq=srq,
        peek_cq=False,
        rearm_n_cq=False,
        resize_cq=True,
        multicast=multicast,
        phys_mr=False,
        shared_mr=False,
        modify_mr=True,
        local_mad=False,
        mad_agents=mad_agents_reason is None,
        vendor_call=False,
        violation_counters=False,
        port_counters=counters_reason is None,
        modify_ca=False,
        inline_data=True,
        immediate=True,
        solicited_events=True,
        sqd=True,
        apm=False,
        async_event_injection=False,
        reasons=reasons,
        deviations=dict(RXE_DEVIATIONS) if rxe else {},
    )
