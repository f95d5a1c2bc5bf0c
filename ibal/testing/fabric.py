"""Whether two CAs' ports share a fabric, for the cross-CA variant of the checks.

InfiniBand ports say so in their attributes (one subnet prefix, distinct LIDs).
RoCE ports do not: two Ethernet ports reach each other when their IP networks
do, which no attribute tells.  So for RoCE the suite tries: a datagram (UD) or
an RC RDMA WRITE from one port to the other, waited for against a deadline.
The answer is kept for the rest of the process, per provider and port pair.

``--ibal-cross-ca=yes|no`` (``ibal conformance --cross-ca``) forces the answer;
``auto`` (the default) leaves it to a class's ``cross_ca`` and then to this module.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ibal.status import IbError
from ibal.testing.helpers import GRH_BYTES, UD_QKEY, RcTiming, is_roce, make_pair, mr_access
from ibal.types import LinkState, PortAttr, QpType, RecvWr, SendWr, UdDest, WcStatus, WrType

if TYPE_CHECKING:
    from ibal.al import Ca
    from ibal.testing.helpers import Pair

CROSS_CA_CHOICES = ("auto", "yes", "no")
OPTION_CROSS_CA = "ibal_cross_ca"
PROBE_TIMING = RcTiming(retry_cnt=1, rnr_retry_cnt=1, local_ack_timeout=14, rnr_nak_timeout=1)


@dataclass(frozen=True)
class Verdict:
    """Whether two ports share a fabric, and how that was found out (for skip reasons)."""

    same: bool
    how: str


_PROBED: dict[Hashable, Verdict] = {}


def by_attributes(a: PortAttr, b: PortAttr) -> Verdict:
    """InfiniBand: one subnet prefix and distinct, non-zero LIDs."""
    if a.link_state is not LinkState.ACTIVE or b.link_state is not LinkState.ACTIVE:
        return Verdict(False, "a port is not ACTIVE")
    if not a.gids or not b.gids:
        return Verdict(False, "a port has no GID")
    if a.gids[0].packed[:8] != b.gids[0].packed[:8]:
        return Verdict(False, "InfiniBand ports with different subnet prefixes")
    if a.lid == 0 or a.lid == b.lid:
        return Verdict(False, f"InfiniBand ports with LIDs {a.lid:#x} and {b.lid:#x}")
    return Verdict(True, "InfiniBand ports on one subnet (prefix, distinct LIDs)")


def same_fabric(
    key: Hashable, ca_a: Ca, port_a: PortAttr, ca_b: Ca, port_b: PortAttr, timeout: float
) -> Verdict:
    """InfiniBand ports by their attributes; RoCE ports by a probe (kept per ``key``)."""
    if not is_roce(port_a) and not is_roce(port_b):
        return by_attributes(port_a, port_b)
    if is_roce(port_a) != is_roce(port_b):
        return Verdict(False, "one InfiniBand and one RoCE port")
    full = (key, ca_a.guid, port_a.port_num, ca_b.guid, port_b.port_num)
    if full not in _PROBED:
        _PROBED[full] = probe(ca_a, port_a, ca_b, port_b, timeout)
    return _PROBED[full]


def probe(ca_a: Ca, port_a: PortAttr, ca_b: Ca, port_b: PortAttr, timeout: float) -> Verdict:
    """Send from ``port_a`` to ``port_b``: UD when both CAs have it, else an RC RDMA WRITE."""
    caps = ca_a.capabilities
    qp_type = QpType.UD if QpType.UD in caps.qp_types & ca_b.capabilities.qp_types else QpType.RC
    what = "a UD datagram" if qp_type is QpType.UD else "an RC RDMA WRITE"
    pair: Pair | None = None
    try:
        pair = make_pair(ca_a, port_a, ca_b, port_b, qp_type, timing=PROBE_TIMING,
                         access=mr_access(caps) & mr_access(ca_b.capabilities))  # fmt: skip
        if _arrives(pair, timeout):
            return Verdict(True, f"RoCE ports that reach each other ({what} arrived)")
        return Verdict(False, f"RoCE ports that do not reach each other ({what} from "
                              f"{ca_a.name} to {ca_b.name} did not arrive within {timeout:g} s)")
    except IbError as exc:
        return Verdict(False, f"RoCE ports the probe could not connect ({exc})")
    finally:
        if pair is not None:
            for side in (pair.a, pair.b):
                side.pd.dealloc(wait=True)
                side.cq.destroy(wait=True)


def _arrives(pair: Pair, timeout: float) -> bool:
    payload = b"ibal fabric probe"
    a, b = pair.a, pair.b
    a.put(0, payload)
    if pair.qp_type is QpType.UD:
        assert a.av is not None
        b.qp.post_recv(RecvWr(wr_id=1, sg_list=[b.sge(0, GRH_BYTES + 64)]))
        a.qp.post_send(SendWr(wr_id=1, sg_list=[a.sge(0, len(payload))],
                              ud=UdDest(av=a.av, remote_qp=b.qp.num, remote_qkey=UD_QKEY)))
        done = b.cq
    else:
        a.qp.post_send(SendWr(wr_id=1, opcode=WrType.RDMA_WRITE, sg_list=[a.sge(0, len(payload))],
                              remote_addr=b.remote(4096), rkey=b.mr.rkey))  # fmt: skip
        done = a.cq
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for wc in done.poll(4):
            if wc.status is not WcStatus.SUCCESS:
                return False
            if pair.qp_type is QpType.UD:
                return b.get(GRH_BYTES, len(payload)) == payload
            return b.get(4096, len(payload)) == payload
        time.sleep(0.001)  # poll interval, not synchronisation: the deadline decides
    return False

