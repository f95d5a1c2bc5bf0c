"""The performance management agent of every mock CA port (class 0x04, IBA vol. 1 16.1).

The engine feeds each port's raw 64-bit counters (``MockPort.pm``) with
:func:`wire_cost` of every message it transmits or delivers: the IB packets
the message stands for and their octets from LRH to VCRC, counted in 4-byte
words as PortXmitData/PortRcvData are.  PortCounters shows them saturated at
2^32 - 1 (IBA 16.1.3.5: a 32-bit counter stops at its maximum),
PortCountersExtended in full; a Set clears the counters its CounterSelect
names, each attribute with its own baseline (as a PMA keeps them apart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.mad import perf
from ibal.mad.consts import PM_EXT_WIDTH_NOIETF_SUP, MadStatus, Method, MgmtClass, PerfAttr
from ibal.mad.header import CLASS_PORT_INFO, PERF_DATA, respond
from ibal.providers.mock.packets import Packet, PacketOp
from ibal.types import QpType

if TYPE_CHECKING:
    from ibal.providers.mock.topology import MockPort

# MockPort.pm: raw counters, then PortCounters' and PortCountersExtended's baselines
XMIT_DATA, RCV_DATA, XMIT_PKTS, RCV_PKTS = 0, 1, 2, 3
PC_BASE, PCE_BASE = 4, 8
PM_SLOTS = 12
MAX32 = 0xFFFF_FFFF
ALL_PORTS = 0xFF
RESP_TIME_VALUE = 18

# CounterSelect bits of the four data counters: PortCounters (16.1.3.5) and the extended one
_PC_SELECT = {XMIT_DATA: 1 << 12, RCV_DATA: 1 << 13, XMIT_PKTS: 1 << 14, RCV_PKTS: 1 << 15}
_PCE_SELECT = {XMIT_DATA: 1 << 0, RCV_DATA: 1 << 1, XMIT_PKTS: 1 << 2, RCV_PKTS: 1 << 3}

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
    """The GetResp of ``port``'s PMA to ``mad``."""
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
                                     capability_mask=PM_EXT_WIDTH_NOIETF_SUP,
                                     resp_time_value=RESP_TIME_VALUE)  # fmt: skip
        return respond(mad, data=cpi)
    if attr_id not in (PerfAttr.PORT_COUNTERS, PerfAttr.PORT_COUNTERS_EXT):
        return respond(mad, status=MadStatus.METHOD_ATTR_UNSUPPORTED)
    ext = attr_id == PerfAttr.PORT_COUNTERS_EXT
    table = perf.PORT_COUNTERS_EXT if ext else perf.PORT_COUNTERS
    req = table.decode(data[: table.size])
    select = int(req["port_select"])
    if select not in (port.num, ALL_PORTS, 0) or (select == 0 and len(port.ca.ports) > 1):
        return respond(mad, status=MadStatus.INVALID_FIELD)
    pm = port.pm
    base, bits = (PCE_BASE, _PCE_SELECT) if ext else (PC_BASE, _PC_SELECT)
    if method == Method.SET:
        mask = int(req["counter_select"])
        for i, bit in bits.items():
            if mask & bit:
                pm[base + i] = pm[i]
    v = [pm[i] - pm[base + i] for i in range(4)]
    if ext:
        out = table.encode(
            port_select=select, counter_select=req["counter_select"],
            port_xmit_data=v[0], port_rcv_data=v[1], port_xmit_pkts=v[2], port_rcv_pkts=v[3],
        )  # fmt: skip
    else:
        out = table.encode(
            port_select=select, counter_select=req["counter_select"],
            port_xmit_data=min(v[0], MAX32), port_rcv_data=min(v[1], MAX32),
            port_xmit_pkts=min(v[2], MAX32), port_rcv_pkts=min(v[3], MAX32),
        )  # fmt: skip
    return respond(mad, data=out)
