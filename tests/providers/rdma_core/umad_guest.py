"""Run inside the lab guest: a GSI request and its response through the kernel's MAD layer.

Two MAD agents on ``rxe0`` port 1, both on alias QPs of the access layer (the
rdma_core provider serves them over libibumad): a server registered for a
vendor class's Get, a client that sends a Get to its own port's QP1 through
the loopback GID and waits for the GetResp.  Prints one JSON line with what
was seen; the host-side test asserts on it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys

VENDOR = 0x09
GET, GET_RESP = 0x01, 0x81
WAIT = 20.0


def main() -> int:
    out: dict[str, object] = {}
    probe = subprocess.run(["modprobe", "ib_umad"], capture_output=True, text=True)
    out["modprobe"] = probe.returncode
    import ibal
    from ibal.types import (
        MAD_SIZE,
        QP1_WELL_KNOWN_QKEY,
        Grh,
        MadAddr,
        MadRecv,
        MadSend,
        MadSendDone,
        QpType,
    )

    with ibal.open_al(providers=["rdma_core"]) as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        caps = ca.capabilities
        out["mad_agents"] = caps.mad_agents
        out["reason"] = caps.reasons.get("mad_agents", "")
        if not caps.mad_agents:
            print(json.dumps(out))
            return 1
        port = ca.query().ports[0]
        out["gids"] = [str(g) for g in port.gids]
        # An IPv6 GID: with RoCE v2 over IPv4 the GRH area holds an IPv4 header, and
        # the kernel's response matching compares GIDs from it (see docs/decisions.md).
        want = os.environ.get("GID_INDEX")
        gid_index = int(want) if want else next(
            (i for i, g in enumerate(port.gids)
             if g.ipv4_mapped is None and not g.is_link_local and int(g)),
            next((i for i, g in enumerate(port.gids) if g.ipv4_mapped is not None), 0),
        )
        out["gid"] = str(port.gids[gid_index])
        pd = ca.alloc_pd()
        alias = pd.get_spl_qp(port.port_guid, QpType.QP1_ALIAS)
        server_in: queue.Queue[MadRecv] = queue.Queue()
        client_in: queue.Queue[MadRecv] = queue.Queue()
        client_done: queue.Queue[MadSendDone] = queue.Queue()
        server = alias.register_agent(VENDOR, 1, methods={GET}, recv_cb=server_in.put)
        client = alias.register_agent(
            VENDOR, 1, recv_cb=client_in.put, send_cb=client_done.put
        )
        req = bytearray(MAD_SIZE)
        req[0:4] = bytes([1, VENDOR, 1, GET])
        req[12:16] = (0xC0FFEE).to_bytes(4, "big")
        req[16:18] = (0x0010).to_bytes(2, "big")
        req[24:29] = b"hello"
        here = MadAddr(
            remote_qp=1,
            remote_qkey=QP1_WELL_KNOWN_QKEY,
            grh=Grh(dgid=port.gids[gid_index], sgid_index=gid_index),
        )
        client.send(MadSend(bytes(req), here, timeout_ms=2000, retries=2, context="req"))
        got = server_in.get(timeout=WAIT)
        out["server_got_payload"] = got.mad[24:29].decode()
        out["server_got_tid_low"] = int.from_bytes(got.mad[12:16], "big")
        out["server_got_from_qp"] = got.addr.remote_qp
        out["server_got_grh"] = str(got.addr.grh.dgid) if got.addr.grh else None
        out["server_got_qkey"] = got.addr.remote_qkey
        resp = bytearray(got.mad)
        resp[3] = GET_RESP
        resp[24:29] = b"world"
        server.send(MadSend(bytes(resp), got.addr))
        try:
            answer = client_in.get(timeout=WAIT)
        except queue.Empty:
            out["client_done"] = str(client_done.get(timeout=WAIT))
            print(json.dumps(out))
            return 1
        out["client_got_method"] = answer.mad[3]
        out["client_got_payload"] = answer.mad[24:29].decode()
        out["client_got_tid_low"] = int.from_bytes(answer.mad[12:16], "big")
        done = client_done.get(timeout=WAIT)
        out["client_send_status"] = done.status.name
        out["client_send_context"] = done.context
        # A request of a class nobody serves: the kernel's GSI answers it itself.
        lost = bytearray(req)
        lost[1] = 0x0B
        lost[12:16] = (0xBAD).to_bytes(4, "big")
        stray = alias.register_agent(0x0B, 1, send_cb=client_done.put, recv_cb=client_in.put)
        stray.send(MadSend(bytes(lost), here, timeout_ms=1000, retries=1, context="lost"))
        late = client_done.get(timeout=WAIT)
        out["unclaimed_send_status"] = late.status.name
        out["unclaimed_send_context"] = late.context
        if late.status.name == "SUCCESS":
            reply = client_in.get(timeout=WAIT)
            out["unclaimed_reply_method"] = reply.mad[3]
            out["unclaimed_reply_status"] = int.from_bytes(reply.mad[4:6], "big")
        alias.destroy(wait=True)
        pd.dealloc(wait=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
