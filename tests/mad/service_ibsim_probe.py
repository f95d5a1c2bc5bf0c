"""Run under umad2sim (ibsim) as a node: the MAD service on the MAD-only CA.

An SMP service on a QP0 alias asks the local port's SMA for NodeInfo
(directed route, ``transact``), and an SA service on a QP1 alias asks OpenSM
for the NodeRecord of ``QUERY_LID`` (send with ``resp_expected``, response
linked to its request).  Prints one JSON line for ``test_service_ibsim.py``.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import sys

WAIT = 20.0


def main() -> int:
    import ibal
    from ibal.mad import MadElement, MadSvc, put_mad, reg_mad_svc, transact
    from ibal.types import MAD_SIZE, QP1_WELL_KNOWN_QKEY, MadAddr, QpType

    al = ibal.open_al()
    ca = next(c for c in (al.open_ca(g) for g in al.get_ca_guids()) if c.name == "ibsim0")
    port = ca.query().port(1)
    pd = ca.alloc_pd()
    out: dict[str, object] = {"ca_guid": ca.guid, "lid": port.lid, "sm_lid": port.sm_lid}

    def ignore(_e: MadElement) -> None:
        return None

    smp = reg_mad_svc(pd.get_spl_qp(port.port_guid, QpType.QP0_ALIAS),
                      MadSvc(0x81, 1, ignore, ignore))
    e = smp.pool_key.get_mad()
    e.mad[0:4] = bytes([1, 0x81, 1, 0x01])
    e.mad[16:18] = (0x0011).to_bytes(2, "big")  # NodeInfo
    e.mad[32:36] = b"\xff" * 4  # DR SLID/DLID: permissive
    e.addr = MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF)
    e.timeout_ms, e.retry_cnt = 1000, 3
    r = transact(smp, e, timeout=WAIT)
    ni = bytes(r.mad[64:104])
    out["smp_method"] = r.mad[3]
    out["smp_tid_matches"] = r.tid & 0xFFFFFFFF == e.tid & 0xFFFFFFFF
    out["node_guid"], out["port_guid"] = struct.unpack_from(">QQ", ni, 12)
    put_mad([r, e])

    answers: queue.Queue[MadElement] = queue.Queue()
    sent: queue.Queue[MadElement] = queue.Queue()
    sa = reg_mad_svc(pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS),
                     MadSvc(0x03, 2, answers.put, sent.put))
    q = sa.pool_key.get_mad()
    q.mad[0:4] = bytes([1, 0x03, 2, 0x01])  # SubnAdmGet
    q.mad[16:18] = (0x0011).to_bytes(2, "big")  # NodeRecord
    q.mad[48:56] = (1).to_bytes(8, "big")  # ComponentMask: LID
    q.mad[56:58] = int(os.environ["QUERY_LID"]).to_bytes(2, "big")
    q.addr = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=port.sm_lid)
    q.resp_expected, q.timeout_ms, q.retry_cnt, q.context1 = True, 1000, 3, "nr"
    sa.send(q)
    out["sa_send"] = sent.get(timeout=WAIT).status.name
    a = answers.get(timeout=WAIT)
    rec = bytes(a.mad[56:MAD_SIZE])
    out["sa_linked"] = a.request is q and a.send_context1 == "nr"
    out["sa_status"] = struct.unpack_from(">H", a.mad, 4)[0]
    out["sa_lid"] = struct.unpack_from(">H", rec, 0)[0]
    out["sa_node_guid"] = struct.unpack_from(">Q", rec, 4 + 12)[0]
    put_mad([a, q])
    sa.deregister(wait=True)
    smp.deregister(wait=True)
    al.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
