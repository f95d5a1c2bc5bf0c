"""Run under umad2sim (ibsim): SubnAdmGetTable(NodeRecord) to OpenSM, RMPP header decoded.

ibsim has no RMPP, so OpenSM's answer arrives as the one MAD OpenSM hands
its MAD layer; this prints (one JSON line) what :mod:`ibal.transport.rmpp` makes
of its RMPP header, and the MAD itself, for ``test_rmpp_ibsim.py``.
"""

from __future__ import annotations

import json
import queue
import struct
import sys

from ibal.providers.rdma_core import umad
from ibal.types import QP1_WELL_KNOWN_QKEY, MadAddr, MadAgentSpec, MadRecv, MadSend, MadSendDone
from ibal.wire.mad.rmpp import RmppFlags, RmppHeader, RmppType, is_rmpp

WAIT = 20.0


def main() -> int:
    agents = umad.UmadAgents("ibsim0")
    rx: queue.Queue[MadRecv] = queue.Queue()
    done: queue.Queue[MadSendDone] = queue.Queue()
    try:
        smp = agents.register(MadAgentSpec(1, 0, 0x81, 1, rx.put, done.put))
        m = bytearray(256)
        m[0:4] = bytes([1, 0x81, 1, 0x01])
        m[12:16] = (1).to_bytes(4, "big")
        m[16:18] = (0x0015).to_bytes(2, "big")  # PortInfo of the local port: the SM LID
        struct.pack_into(">HH", m, 32, 0xFFFF, 0xFFFF)
        agents.send(smp, MadSend(bytes(m), MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF),
                                 timeout_ms=1000, retries=3))  # fmt: skip
        sm_lid = struct.unpack_from(">H", rx.get(timeout=WAIT).mad, 64 + 18)[0]
        done.get(timeout=WAIT)
        sa = agents.register(MadAgentSpec(1, 1, 0x03, 2, rx.put, done.put))
        q = bytearray(256)
        q[0:4] = bytes([1, 0x03, 2, 0x12])  # SubnAdmGetTable
        q[8:16] = (0x5A5A).to_bytes(8, "big")
        q[16:18] = (0x0011).to_bytes(2, "big")  # NodeRecord
        to_sa = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=sm_lid)
        agents.send(sa, MadSend(bytes(q), to_sa, timeout_ms=1000, retries=3))
        r = rx.get(timeout=WAIT)
        h = RmppHeader.of(r.mad)
        out = {
            "method": r.mad[3], "active": is_rmpp(r.mad), "type": RmppType(h.type).name,
            "version": h.version, "segment": h.segment_number,
            "first": bool(h.flags & RmppFlags.FIRST), "last": bool(h.flags & RmppFlags.LAST),
            "status": h.status, "payload_length": h.payload_length,
            "attr_offset": struct.unpack_from(">H", r.mad, 44)[0], "mad": bytes(r.mad).hex(),
        }  # fmt: skip
        done.get(timeout=WAIT)
    finally:
        agents.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
