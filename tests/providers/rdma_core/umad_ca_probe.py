"""Run under umad2sim (ibsim): the rdma_core provider's MAD-only CA through the access layer.

Prints JSON lines: ``{"attrs": ...}`` (the CA found by ``ibal.open_al()``, its
capabilities and port 1), ``{"smp": ...}`` (SubnGet(NodeInfo) on a QP0 alias,
directed route to the local port), ``{"sa": ...}`` (SubnAdmGet(NodeRecord) of
``SA_LID`` on a QP1 alias, answered by OpenSM), then ``{"ready": true}`` and
one ``{"pnp": EVENT, "state": ..., "lid": ...}`` line per PnP port event until
stdin closes.  ``test_umad_ca_ibsim.py`` drives it and compares.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import sys

import ibal
from ibal.al.pnp import PnpClass, PnpRec
from ibal.status import Unsupported
from ibal.types import (
    MAD_SIZE,
    QP1_WELL_KNOWN_QKEY,
    MadAddr,
    MadRecv,
    MadSend,
    MadSendDone,
    QpType,
)

WAIT = 20.0


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def query(agent: object, mad: bytes, addr: MadAddr, rx: queue.Queue[MadRecv],
          done: queue.Queue[MadSendDone]) -> tuple[MadRecv, str]:  # fmt: skip
    agent.send(MadSend(mad, addr, timeout_ms=1000, retries=3, context="q"))  # type: ignore[attr-defined]
    return rx.get(timeout=WAIT), done.get(timeout=WAIT).status.name


def main() -> int:
    al = ibal.open_al()
    cas = [al.open_ca(g) for g in al.get_ca_guids()]
    ca = next(c for c in cas if c.name == "ibsim0")
    attr = ca.query()
    port = attr.port(1)
    caps = ca.capabilities
    emit(attrs={
        "provider": ca.provider_name, "node_guid": attr.ca_guid, "qp_types": len(caps.qp_types),
        "mad_agents": caps.mad_agents, "port_guid": port.port_guid, "lid": port.lid,
        "sm_lid": port.sm_lid, "state": port.link_state.name, "lmc": port.lmc,
        "pkey0": port.pkeys[0], "gid0": str(port.gids[0]), "create_cq_refused": _refused(ca),
    })  # fmt: skip
    pd = ca.alloc_pd()
    rx: queue.Queue[MadRecv] = queue.Queue()
    done: queue.Queue[MadSendDone] = queue.Queue()

    # SMP: SubnGet(NodeInfo) to the local port, directed route, hop count 0.
    qp0 = pd.get_spl_qp(port.port_guid, QpType.QP0_ALIAS)
    smp_agent = qp0.register_agent(0x81, 1, recv_cb=rx.put, send_cb=done.put)
    m = bytearray(MAD_SIZE)
    m[0:4] = bytes([1, 0x81, 1, 0x01])
    m[12:16] = (0x51).to_bytes(4, "big")
    m[16:18] = (0x0011).to_bytes(2, "big")
    m[32:36] = b"\xff" * 4
    r, status = query(smp_agent, bytes(m), MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF),
                      rx, done)  # fmt: skip
    ni = r.mad[64:104]
    sys_guid, node_guid, port_guid = struct.unpack_from(">QQQ", ni, 4)
    emit(smp={"method": r.mad[3], "status": status, "node_type": ni[2], "num_ports": ni[3],
              "sys_guid": sys_guid, "node_guid": node_guid, "port_guid": port_guid,
              "local_port": ni[36]})  # fmt: skip

    # SA: SubnAdmGet(NodeRecord) with the LID as the component (mask bit 0).
    sa_lid = int(os.environ["SA_LID"])
    qp1 = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
    sa_agent = qp1.register_agent(0x03, 2, recv_cb=rx.put, send_cb=done.put)
    q = bytearray(MAD_SIZE)
    q[0:4] = bytes([1, 0x03, 2, 0x01])
    q[12:16] = (0x52).to_bytes(4, "big")
    q[16:18] = (0x0011).to_bytes(2, "big")
    q[48:56] = (1).to_bytes(8, "big")  # SA header ComponentMask: LID
    q[56:58] = sa_lid.to_bytes(2, "big")
    to_sa = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=port.sm_lid)
    r, status = query(sa_agent, bytes(q), to_sa, rx, done)
    rec = r.mad[56:]
    emit(sa={"method": r.mad[3], "mad_status": struct.unpack_from(">H", r.mad, 4)[0],
             "status": status, "lid": struct.unpack_from(">H", rec, 0)[0],
             "node_guid": struct.unpack_from(">Q", rec, 4 + 12)[0],
             "port_guid": struct.unpack_from(">Q", rec, 4 + 20)[0],
             "desc": rec[44:108].split(b"\0")[0].decode(errors="replace")})  # fmt: skip

    def on_pnp(rec: PnpRec) -> None:
        p = rec.port_attr
        emit(pnp=rec.event.name, state=p.link_state.name if p else None,
             lid=p.lid if p else None)  # fmt: skip

    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, on_pnp)
    emit(ready=True)
    sys.stdin.read()  # the test closes stdin when it has seen what it waits for
    al.close()
    return 0


def _refused(ca: object) -> str:
    try:
        ca.create_cq(16)  # type: ignore[attr-defined]
    except Unsupported as exc:
        return str(exc)
    return "accepted"


if __name__ == "__main__":
    sys.exit(main())
