"""Run under umad2sim (ibsim): open and close the MAD-only CA many times in one process.

Each round opens an access layer and ``ibsim0``'s CA, registers a QP0 and a QP1
agent, asks the local SMA for NodeInfo (one answer awaited, then more
requests left in flight) and a SubnAdmGet(NodeRecord) of the SM's LID,
deregisters the agents at once and closes everything.  Prints one JSON line
per round (``{"round", "node_guid", "sa_lid"}``), then ``{"done": rounds}``.
``test_umad_ca_ibsim.py`` checks the answers and that the process ends well
(umad2sim dereferences NULL for a MAD whose class has no registration).
"""

from __future__ import annotations

import json
import os
import queue
import struct
import sys

import ibal
from ibal.types import MAD_SIZE, QP1_WELL_KNOWN_QKEY, MadAddr, MadRecv, MadSend, QpType

WAIT = 20.0
HERE = MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF)


def node_info(tid: int) -> bytes:
    m = bytearray(MAD_SIZE)
    m[0:4] = bytes([1, 0x81, 1, 0x01])
    m[12:16] = tid.to_bytes(4, "big")
    m[16:18] = (0x0011).to_bytes(2, "big")
    m[32:36] = b"\xff" * 4  # DrSLID, DrDLID: permissive
    return bytes(m)


def node_record(tid: int, lid: int) -> bytes:
    q = bytearray(MAD_SIZE)
    q[0:4] = bytes([1, 0x03, 2, 0x01])
    q[12:16] = tid.to_bytes(4, "big")
    q[16:18] = (0x0011).to_bytes(2, "big")
    q[48:56] = (1).to_bytes(8, "big")  # ComponentMask: LID
    q[56:58] = lid.to_bytes(2, "big")
    return bytes(q)


def answer(rx: queue.Queue[MadRecv], tid: int) -> bytes:
    while True:
        r = rx.get(timeout=WAIT)
        if int.from_bytes(r.mad[12:16], "big") == tid:
            return r.mad


def main() -> int:
    rounds = int(os.environ.get("ROUNDS", "12"))
    for n in range(rounds):
        al = ibal.open_al()
        ca = next(c for c in (al.open_ca(g) for g in al.get_ca_guids()) if c.name == "ibsim0")
        port = ca.query().port(1)
        pd = ca.alloc_pd()
        rx: queue.Queue[MadRecv] = queue.Queue()
        qp0 = pd.get_spl_qp(port.port_guid, QpType.QP0_ALIAS)
        qp1 = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
        smp = qp0.register_agent(0x81, 1, recv_cb=rx.put)
        sa = qp1.register_agent(0x03, 2, recv_cb=rx.put)
        base = 0x100 * (n + 1)
        smp.send(MadSend(node_info(base), HERE, timeout_ms=0))
        ni = answer(rx, base)
        sa.send(MadSend(node_record(base + 1, port.sm_lid), MadAddr(
            remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=port.sm_lid), timeout_ms=0))
        rec = answer(rx, base + 1)
        for k in range(2, 6):  # answers still to come when the agents go
            smp.send(MadSend(node_info(base + k), HERE, timeout_ms=0))
        smp.deregister(wait=True)
        sa.deregister(wait=True)
        al.close()
        print(json.dumps({"round": n, "node_guid": struct.unpack_from(">Q", ni, 64 + 12)[0],
                          "sa_lid": struct.unpack_from(">H", rec, 56)[0]}), flush=True)
    print(json.dumps({"done": rounds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
