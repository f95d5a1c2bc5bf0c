"""Run under umad2sim (ibsim): an SMP and an SA query through the rdma_core umad backend.

Uses :class:`ibal.providers.rdma_core.umad.UmadAgents` directly, the transport
under the MAD-only CA (``umad_ca_probe.py`` goes through the access layer).
Prints one JSON line; ``test_umad_ibsim.py`` compares it with infiniband-diags.
"""

from __future__ import annotations

import json
import queue
import struct
import sys

from ibal.providers.rdma_core import umad
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    MadAddr,
    MadAgentSpec,
    MadRecv,
    MadSend,
    MadSendDone,
)

WAIT = 20.0
CA = "ibsim0"


def main() -> int:
    out: dict[str, object] = {"cas": umad.umad_cas()}
    agents = umad.UmadAgents(CA)
    rx: queue.Queue[MadRecv] = queue.Queue()
    done: queue.Queue[MadSendDone] = queue.Queue()
    try:
        # SubnGet(PortInfo), directed route with hop count 0: the local port's SMA.
        smp = agents.register(MadAgentSpec(1, 0, 0x81, 1, rx.put, done.put))
        m = bytearray(MAD_SIZE)
        m[0:4] = bytes([1, 0x81, 1, 0x01])
        m[12:16] = (1).to_bytes(4, "big")
        m[16:18] = (0x0015).to_bytes(2, "big")
        struct.pack_into(">HH", m, 32, 0xFFFF, 0xFFFF)  # DrSLID, DrDLID: permissive
        here = MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF)
        agents.send(smp, MadSend(bytes(m), here, timeout_ms=1000, retries=3, context="smp"))
        r = rx.get(timeout=WAIT)
        pi = r.mad[64:128]
        out["smp_method"] = r.mad[3]
        out["lid"], out["sm_lid"] = struct.unpack_from(">HH", pi, 16)
        out["port_state"] = pi[32] & 0xF
        out["smp_done"] = done.get(timeout=WAIT).status.name
        # SubnAdmGetTable(NodeRecord), no component: ibsim has no RMPP, so the
        # answer is OpenSM's first segment, holding the first record.
        sa = agents.register(MadAgentSpec(1, 1, 0x03, 2, rx.put, done.put))
        q = bytearray(MAD_SIZE)
        q[0:4] = bytes([1, 0x03, 2, 0x12])
        q[12:16] = (2).to_bytes(4, "big")
        q[16:18] = (0x0011).to_bytes(2, "big")
        to_sa = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=int(out["sm_lid"]))
        agents.send(sa, MadSend(bytes(q), to_sa, timeout_ms=1000, retries=3, context="sa"))
        r = rx.get(timeout=WAIT)
        out["sa_method"] = r.mad[3]
        out["sa_status"] = struct.unpack_from(">H", r.mad, 4)[0]
        rec = r.mad[56:]
        out["rec_lid"] = struct.unpack_from(">H", rec, 0)[0]
        out["rec_node_guid"], out["rec_port_guid"] = struct.unpack_from(">QQ", rec, 4 + 12)
        out["rec_desc"] = rec[44:108].split(b"\0")[0].decode(errors="replace")
        out["sa_done"] = done.get(timeout=WAIT).status.name
        agents.unregister(smp)
        agents.unregister(sa)
    finally:
        agents.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
