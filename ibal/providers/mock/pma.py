"""The performance management agent of every mock CA port (class 0x04, IBA vol. 1 16.1).

The engine feeds each port's raw 64-bit counters (``MockPort.pm``) with
:func:`wire_cost` of every message it transmits or delivers: the IB packets
the message stands for and their octets from LRH to VCRC, counted in 4-byte
words as PortXmitData/PortRcvData are.  PortCounters shows them saturated at
2^32 - 1 (IBA 16.1.3.5: a 32-bit counter stops at its maximum),
PortCountersExtended in full; a Set clears the counters its CounterSelect
names, each attribute with its own baseline (as a PMA keeps them apart).
Switch ports count every message crossing them (:meth:`Engine._transmit`),
and the error counters what the fabric's faults make of the traffic:
PortRcvErrors a packet arriving with a bad ICRC, PortXmitDiscards one the
port could not send (no live route), LinkDownedCounter a link going down.
QP1Dropped counts the MADs a CA port dropped at QP1 (no QP1 open, QP1 not
ready, no receive posted), VL15Dropped the SMPs a port dropped: one the
port's SMI discarded (malformed, a hop count past 63, a directed route
through a dead port or a CA, a LID-routed leg that does not lead on), at the
node where it stopped (the sender's port for one it could not send), and an
SMP response arriving at a QP0 that cannot take it.  MADs the access layer
drops above the CA (no agent of the class, a bad header) are not the
port's: they are in ``AliasQp.transport_stats``, as the kernel's MAD-layer
drops are not in a real HCA's PMA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.providers.mock.packets import Packet, PacketOp
from ibal.providers.mock.topology import PM_RAW
from ibal.types import QpType
from ibal.wire.mad import perf
from ibal.wire.mad.consts import (
    PM_ALL_PORT_SELECT,
    PM_EXT_WIDTH_NOIETF_SUP,
    MadStatus,
    Method,
    MgmtClass,
    PerfAttr,
)
from ibal.wire.mad.header import CLASS_PORT_INFO, PERF_DATA, respond

if TYPE_CHECKING:
    from ibal.providers.mock.topology import MockPort, Switch

# A port's counters (MockPort.pm, Switch.pm[n]): the raw counters, then PortCounters' and
# PortCountersExtended's baselines (a Set copies the raw value into the baseline)
XMIT_DATA, RCV_DATA, XMIT_PKTS, RCV_PKTS = 0, 1, 2, 3
RCV_ERRORS, XMIT_DISCARDS, LINK_DOWNED, QP1_DROPPED, VL15_DROPPED = 4, 5, 6, 7, 8
PC_BASE, PCE_BASE = PM_RAW, 2 * PM_RAW
MAX32 = 0xFFFF_FFFF
ALL_PORTS = 0xFF
RESP_TIME_VALUE = 18
# AllPortSelect (0xFF sums every port), PortCountersExtended without the IETF counters
CAPABILITY_MASK = PM_ALL_PORT_SELECT | PM_EXT_WIDTH_NOIETF_SUP

# PortCounters (16.1.3.5): counter -> (its CounterSelect bit, the field, its maximum)
_PC = {
    XMIT_DATA: (1 << 12, "port_xmit_data", MAX32),
    RCV_DATA: (1 << 13, "port_rcv_data", MAX32),
    XMIT_PKTS: (1 << 14, "port_xmit_pkts", MAX32),
    RCV_PKTS: (1 << 15, "port_rcv_pkts", MAX32),
    RCV_ERRORS: (1 << 3, "port_rcv_errors", 0xFFFF),
    XMIT_DISCARDS: (1 << 6, "port_xmit_discards", 0xFFFF),
    LINK_DOWNED: (1 << 2, "link_downed_counter", 0xFF),
    VL15_DROPPED: (1 << 11, "vl15_dropped", 0xFFFF),
    # QP1Dropped is selected by CounterSelect2 (bit 0 here; perfquery -R sets all 8)
    QP1_DROPPED: (1 << 16, "qp1_dropped", 0xFFFF),
}
# PortCountersExtended (16.1.4.11): 64 bits, no saturation in practice
_PCE = {
    XMIT_DATA: (1 << 0, "port_xmit_data", (1 << 64) - 1),
    RCV_DATA: (1 << 1, "port_rcv_data", (1 << 64) - 1),
    XMIT_PKTS: (1 << 2, "port_xmit_pkts", (1 << 64) - 1),
    RCV_PKTS: (1 << 3, "port_rcv_pkts", (1 << 64) - 1),
}

_LINK = 8 + 12 + 4 + 2  # LRH, BTH, ICRC, VCRC: every packet
# Indexed by PacketOp: extension headers a message carries once (RETH, AtomicETH,
# AETH, ImmDt...), and whether its npsn counts packets (data messages) or not.
_ONCE = [0] * (max(PacketOp) + 1)
_MULTI = [False] * (max(PacketOp) + 1)
for _op, _octets in (
    (PacketOp.SEND, 0), (PacketOp.SEND_IMM, 4), (PacketOp.RDMA_WRITE, 16),
    (PacketOp.RDMA_WRITE_IMM, 20), (PacketOp.RDMA_READ_REQ, 16), (PacketOp.COMPARE_SWAP, 28),
    (PacketOp.FETCH_ADD, 28), (PacketOp.ACK, 4), (PacketOp.NAK, 4), (PacketOp.RNR_NAK, 4),
    (PacketOp.READ_RESP, 4), (PacketOp.ATOMIC_ACK, 12),
):  # fmt: skip
    _ONCE[_op] = _octets
for _op in (PacketOp.SEND, PacketOp.SEND_IMM, PacketOp.RDMA_WRITE, PacketOp.RDMA_WRITE_IMM,
            PacketOp.READ_RESP):  # fmt: skip
    _MULTI[_op] = True
_UD = QpType.UD
_READ_RESP = PacketOp.READ_RESP


def wire_cost(pkt: Packet) -> tuple[int, int]:
    """(IB packets, 4-byte words from LRH to VCRC) of one mock message.

    On the engine's per-packet path: table lookups and integer arithmetic only.
    """
    op = pkt.op
    octets = _ONCE[op]
    if _MULTI[op]:
        length = pkt.length
        octets += length + (-length & 3)
        if pkt.transport is _UD:  # one packet: DETH, maybe a GRH
            n = 1
            octets += _LINK + 8 + (0 if pkt.grh is None else 40)
        else:
            n = pkt.npsn
            octets += n * _LINK
            if op is _READ_RESP and n > 1:
                octets += 4  # AETH in the first and the last packet
            elif pkt.inv is not None:
                octets += 4  # IETH
        return n, octets >> 2
    return 1, (octets + _LINK) >> 2  # requests without payload, ACKs: one packet


def answer(port: MockPort, mad: bytes) -> bytearray:
    """The GetResp of the PMA of ``port``'s CA (any of its ports, or 0xFF) to ``mad``."""
    ports = {p.num: p.pm for p in port.ca.ports}
    if len(ports) == 1:
        ports[0] = port.pm  # PortSelect 0 on a one-port CA: that port
    return _answer(ports, mad)


def answer_switch(sw: Switch, mad: bytes) -> bytearray:
    """The GetResp of switch ``sw``'s PMA: the counters of the traffic crossing its ports."""
    return _answer(dict(enumerate(sw.pm)), mad)


def _answer(ports: dict[int, list[int]], mad: bytes) -> bytearray:
    if mad[1] != MgmtClass.PERF or mad[0] != 1 or mad[2] != 1:
        return respond(mad, status=MadStatus.BAD_VERSION)
    method = mad[3]
    if method not in (Method.GET, Method.SET):
        return respond(mad, status=MadStatus.METHOD_UNSUPPORTED)
    attr_id = int.from_bytes(mad[16:18], "big")
    data = bytes(mad[PERF_DATA:])
    if attr_id == PerfAttr.CLASS_PORT_INFO:
        if method != Method.GET:
            return respond(mad, status=MadStatus.METHOD_ATTR_UNSUPPORTED)
        cpi = CLASS_PORT_INFO.encode(base_version=1, class_version=1,
                                     capability_mask=CAPABILITY_MASK,
                                     resp_time_value=RESP_TIME_VALUE)  # fmt: skip
        return respond(mad, data=cpi)
    if attr_id not in (PerfAttr.PORT_COUNTERS, PerfAttr.PORT_COUNTERS_EXT):
        return respond(mad, status=MadStatus.METHOD_ATTR_UNSUPPORTED)
    ext = attr_id == PerfAttr.PORT_COUNTERS_EXT
    table = perf.PORT_COUNTERS_EXT if ext else perf.PORT_COUNTERS
    req = table.decode(data[: table.size])
    select = int(req["port_select"])
    if select == ALL_PORTS:
        pms = list({id(pm): pm for pm in ports.values()}.values())
    elif select in ports:
        pms = [ports[select]]
    else:
        return respond(mad, status=MadStatus.INVALID_FIELD)
    base, counters = (PCE_BASE, _PCE) if ext else (PC_BASE, _PC)
    if method == Method.SET:
        mask = int(req["counter_select"])
        if not ext and int(req["counter_select2"]) & 1:
            mask |= 1 << 16
        for pm in pms:
            for i, (bit, _, _) in counters.items():
                if mask & bit:
                    pm[base + i] = pm[i]
    values = {name: min(sum(pm[i] - pm[base + i] for pm in pms), top)
              for i, (_, name, top) in counters.items()}  # fmt: skip
    if not ext:
        values["counter_select2"] = int(req["counter_select2"])
    out = table.encode(port_select=select, counter_select=req["counter_select"], **values)
    return respond(mad, data=out)
