"""What can be checked against the real pyverbs without a device.

Skips (naming python3-pyverbs) where pyverbs is not installed.
"""

from __future__ import annotations

import ctypes
from typing import Any

from ibal.ci import KNOWN_DEVIATIONS
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import peek
from ibal.providers.rdma_core.caps import SPECIAL_QPS_REASON, build_capabilities
from ibal.types import AsyncEvent, QpType, WrType


def test_constants_match_pyverbs_enums(pyverbs_or_skip: Any) -> None:
    import pyverbs.enums as e

    pairs = {
        "IBV_QPT_RC": C.IBV_QPT_RC, "IBV_QPT_UC": C.IBV_QPT_UC, "IBV_QPT_UD": C.IBV_QPT_UD,
        "IBV_QPS_RESET": C.IBV_QPS_RESET, "IBV_QPS_RTS": C.IBV_QPS_RTS,
        "IBV_QPS_SQE": C.IBV_QPS_SQE, "IBV_QPS_ERR": C.IBV_QPS_ERR,
        "IBV_QP_STATE": C.IBV_QP_STATE, "IBV_QP_AV": C.IBV_QP_AV,
        "IBV_QP_DEST_QPN": C.IBV_QP_DEST_QPN, "IBV_QP_CAP": C.IBV_QP_CAP,
        "IBV_QP_MAX_DEST_RD_ATOMIC": C.IBV_QP_MAX_DEST_RD_ATOMIC,
        "IBV_QP_EN_SQD_ASYNC_NOTIFY": C.IBV_QP_EN_SQD_ASYNC_NOTIFY,
        "IBV_ACCESS_LOCAL_WRITE": C.IBV_ACCESS_LOCAL_WRITE,
        "IBV_ACCESS_REMOTE_ATOMIC": C.IBV_ACCESS_REMOTE_ATOMIC,
        "IBV_ACCESS_MW_BIND": C.IBV_ACCESS_MW_BIND,
        "IBV_WR_RDMA_WRITE": C.IBV_WR_RDMA_WRITE, "IBV_WR_SEND_WITH_IMM": C.IBV_WR_SEND_WITH_IMM,
        "IBV_WR_ATOMIC_FETCH_AND_ADD": C.IBV_WR_ATOMIC_FETCH_AND_ADD,
        "IBV_WR_BIND_MW": C.IBV_WR_BIND_MW, "IBV_WR_LOCAL_INV": C.IBV_WR_LOCAL_INV,
        "IBV_WR_SEND_WITH_INV": C.IBV_WR_SEND_WITH_INV, "IBV_WC_LOCAL_INV": C.IBV_WC_LOCAL_INV,
        "IBV_WC_WITH_INV": C.IBV_WC_WITH_INV,
        "IBV_DEVICE_MEM_MGT_EXTENSIONS": C.IBV_DEVICE_MEM_MGT_EXTENSIONS,
        "IBV_DEVICE_MEM_WINDOW_TYPE_2B": C.IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        "IBV_MW_TYPE_2": C.IBV_MW_TYPE_2,
        "IBV_SEND_SIGNALED": C.IBV_SEND_SIGNALED, "IBV_SEND_INLINE": C.IBV_SEND_INLINE,
        "IBV_WC_RECV": C.IBV_WC_RECV, "IBV_WC_RECV_RDMA_WITH_IMM": C.IBV_WC_RECV_RDMA_WITH_IMM,
        "IBV_WC_BIND_MW": C.IBV_WC_BIND_MW, "IBV_WC_WITH_IMM": C.IBV_WC_WITH_IMM,
        "IBV_WC_GRH": C.IBV_WC_GRH, "IBV_MIG_ARMED": C.IBV_MIG_ARMED,
        "IBV_DEVICE_MEM_WINDOW": C.IBV_DEVICE_MEM_WINDOW, "IBV_SRQ_LIMIT": C.IBV_SRQ_LIMIT,
        "IBV_LINK_LAYER_ETHERNET": C.IBV_LINK_LAYER_ETHERNET,
        "IBV_GID_TYPE_ROCE_V2": C.IBV_GID_TYPE_ROCE_V2,
    }  # fmt: skip
    for name, mine in pairs.items():
        assert int(getattr(e, name)) == mine, name
    events = {
        "IBV_EVENT_CQ_ERR": AsyncEvent.CQ_ERROR, "IBV_EVENT_QP_FATAL": AsyncEvent.QP_FATAL,
        "IBV_EVENT_COMM_EST": AsyncEvent.QP_COMM, "IBV_EVENT_SQ_DRAINED": AsyncEvent.SQ_DRAINED,
        "IBV_EVENT_PORT_ACTIVE": AsyncEvent.PORT_ACTIVE, "IBV_EVENT_PORT_ERR": AsyncEvent.PORT_DOWN,
        "IBV_EVENT_SRQ_LIMIT_REACHED": AsyncEvent.SRQ_LIMIT_REACHED,
        "IBV_EVENT_QP_LAST_WQE_REACHED": AsyncEvent.SRQ_QP_LAST_WQE_REACHED,
        "IBV_EVENT_GID_CHANGE": AsyncEvent.GID_CHANGE,
    }  # fmt: skip
    for name, code in events.items():
        assert C.EVENT_FROM_IBV[int(getattr(e, name))][0] is code, name
    statuses = [n for n in dir(e) if n.startswith("IBV_WC_") and n.endswith("_ERR")]
    for name in statuses:
        assert int(getattr(e, name)) in C.WC_STATUS_FROM_IBV, name


def test_layout_of_send_wr_and_async_event(pyverbs_or_skip: Any) -> None:
    import pyverbs.base
    import pyverbs.device
    import pyverbs.wr

    layout = peek.Layout(pyverbs.base)
    layout.check_async_event(pyverbs.device.AsyncEvent)
    sge = pyverbs.wr.SGE(0x1234, 8, 0x55)
    wr = pyverbs.wr.SendWR(opcode=C.IBV_WR_BIND_MW, num_sge=0)
    old = layout.adopt_sge(wr, sge)
    assert old, "the scatter array SendWR allocated must be found"
    peek.libc_free(old)
    sge_ptr = layout.sge_struct_ptr(sge)
    assert ctypes.string_at(sge_ptr, 16) == (0x1234).to_bytes(8, "little") + (8).to_bytes(
        4, "little"
    ) + (0x55).to_bytes(4, "little")
    sge.close()
    # pyverbs 44 cannot set a bind's R_Key: the provider stores it through the layout
    bw = pyverbs.wr.SendWR(wr_id=77, opcode=C.IBV_WR_BIND_MW, num_sge=0)
    layout.set_bind_rkey(bw, 0x1234_5678)
    assert bw.rkey == 0x1234_5678
    bw.close()


def test_capabilities_follow_the_device(pyverbs_or_skip: Any) -> None:
    class Dev:
        device_cap_flags = C.IBV_DEVICE_MEM_WINDOW
        atomic_caps = 0
        max_srq = 0
        max_mw = 10
        max_mcast_grp = 0

    caps = build_capabilities(Dev(), {1: C.IBV_LINK_LAYER_ETHERNET}, None)
    assert not caps.atomics and "IBV_ATOMIC_NONE" in caps.reason("atomics")
    assert not caps.supports_opcode(QpType.RC, WrType.FETCH_ADD)
    assert not caps.srq and not caps.multicast
    assert caps.mw_types == frozenset({1}) and "TYPE_2A/2B" in caps.reason("mw_types")
    assert not caps.supports_opcode(QpType.RC, WrType.SEND_WITH_INV)
    assert "MEM_MGT_EXTENSIONS" in caps.reason("opcodes")
    assert caps.special_qps == frozenset()
    assert caps.reason("special_qps") == SPECIAL_QPS_REASON
    for name in ("peek_cq", "rearm_n_cq", "phys_mr", "shared_mr", "local_mad",
                 "violation_counters", "modify_ca", "apm", "fmr"):  # fmt: skip
        assert getattr(caps, name) is False
        assert "does not declare" not in caps.reason(name), name
    assert caps.modify_mr and caps.resize_cq and caps.sqd

    Dev.atomic_caps = 1
    Dev.max_srq = 5
    Dev.max_mcast_grp = 5
    Dev.device_cap_flags = 0
    caps = build_capabilities(Dev(), {1: C.IBV_LINK_LAYER_INFINIBAND}, "no ctypes")
    assert caps.atomics and caps.srq and caps.supports_opcode(QpType.RC, WrType.COMPARE_SWAP)
    assert caps.mw_types == frozenset() and "MEM_WINDOW" in caps.reason("mw_types")
    assert not caps.multicast and caps.reason("multicast") == "no ctypes"

    # type 2 windows (2B, as kernel rxe reports) and the memory management extensions:
    # SEND_WITH_INV on RC, LOCAL_INV and BIND_MW on RC and UC
    Dev.device_cap_flags = (C.IBV_DEVICE_MEM_WINDOW | C.IBV_DEVICE_MEM_WINDOW_TYPE_2B
                            | C.IBV_DEVICE_MEM_MGT_EXTENSIONS)  # fmt: skip
    caps = build_capabilities(Dev(), {1: C.IBV_LINK_LAYER_ETHERNET}, None)
    assert caps.mw_types == frozenset({1, 2})
    for op in (WrType.SEND_WITH_INV, WrType.LOCAL_INV, WrType.BIND_MW):
        assert caps.supports_opcode(QpType.RC, op)
        assert caps.supports_opcode(QpType.UC, op) is (op is not WrType.SEND_WITH_INV)
        assert not caps.supports_opcode(QpType.UD, op)
    Dev.device_cap_flags = C.IBV_DEVICE_MEM_WINDOW | C.IBV_DEVICE_MEM_WINDOW_TYPE_2B
    caps = build_capabilities(Dev(), {1: C.IBV_LINK_LAYER_ETHERNET}, None)
    assert caps.mw_types == frozenset({1, 2})
    assert not caps.supports_opcode(QpType.RC, WrType.LOCAL_INV)


def test_kernel_rxe_deviations_are_declared() -> None:
    class Dev:
        device_cap_flags = C.IBV_DEVICE_MEM_WINDOW
        atomic_caps = 1
        max_srq = 5
        max_mw = 10
        max_mcast_grp = 5
        vendor_id = 0x02C9  # a real HCA (Mellanox)

    hca = build_capabilities(Dev(), {1: C.IBV_LINK_LAYER_INFINIBAND}, None, "mlx5_0")
    assert hca.deviations == {}
    for vendor_id, name in ((0xFFFFFF, "roce0"), (0, "rxe0")):
        Dev.vendor_id = vendor_id
        rxe = build_capabilities(Dev(), {1: C.IBV_LINK_LAYER_ETHERNET}, None, name)
        assert set(rxe.deviations) <= set(KNOWN_DEVIATIONS)
        assert "IBV_WC_LOC_QP_OP_ERR" in (rxe.deviation("precise_local_errors") or "")
        assert "window" in (rxe.deviation("mw_bounds_check") or "")
