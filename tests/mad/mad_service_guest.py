"""Run inside the lab guest: the MAD service over the rdma_core provider's libibumad agents.

A server service answering a vendor class's Get and a client service on the
same port (through the loopback IPv6 GID, kernel rxe's QP1): a request with
its response linked, a blocking ``transact``, a cancel (libibumad cannot stop
a send: the service reports CANCELED itself), the kernel's own answer to a
class nobody serves, a flood of unsolicited Gets at a bounded service while it
waits for an answer (``mad_flood.py``), and a deregistration with a send
pending.  Prints one JSON line; tests/mad/test_service_lab_umad.py asserts on it.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys

VENDOR, GET, SET, SEND, GET_RESP = 0x09, 0x01, 0x02, 0x03, 0x81
WAIT = 20.0


def main() -> int:
    out: dict[str, object] = {}
    subprocess.run(["modprobe", "ib_umad"], capture_output=True, check=False)
    import ibal
    from ibal.mad import MadElement, MadSvc, put_mad, reg_mad_svc, transact
    from ibal.status import IbError
    from ibal.types import QP1_WELL_KNOWN_QKEY, Grh, MadAddr, QpType

    with ibal.open_al(providers=["rdma_core"]) as al:
        ca = al.open_ca(al.get_ca_guids()[0])
        out["mad_agents"] = ca.capabilities.mad_agents
        if not ca.capabilities.mad_agents:
            print(json.dumps(out))
            return 1
        port = ca.query().ports[0]
        gid_index = next(i for i, g in enumerate(port.gids)
                         if g.ipv4_mapped is None and not g.is_link_local and int(g))
        here = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY,
                       grh=Grh(dgid=port.gids[gid_index], sgid_index=gid_index))
        alias = ca.alloc_pd().get_spl_qp(port.port_guid, QpType.QP1_ALIAS)

        def answer(e: MadElement) -> None:
            e.mad[3] = GET_RESP
            e.mad[24:29] = b"world"
            server.send(e)

        server = reg_mad_svc(alias, MadSvc(VENDOR, 1, answer, put_mad,
                                           methods=frozenset({GET}), support_unsol=True))
        order: list[str] = []
        recvs: queue.Queue[MadElement] = queue.Queue()
        sends: queue.Queue[MadElement] = queue.Queue()

        def on_recv(e: MadElement) -> None:
            order.append("recv")
            recvs.put(e)

        def on_send(e: MadElement) -> None:
            order.append("send")
            sends.put(e)

        client = reg_mad_svc(alias, MadSvc(VENDOR, 1, on_recv, on_send))

        def request(method: int, low: int) -> MadElement:
            e = client.pool_key.get_mad()
            e.mad[0:4] = bytes([1, VENDOR, 1, method])
            e.mad[12:16] = low.to_bytes(4, "big")
            e.mad[24:29] = b"hello"
            e.addr, e.resp_expected, e.timeout_ms, e.retry_cnt = here, True, 2000, 1
            e.context1 = f"req{low}"
            return e

        req = request(GET, 0xC0FFEE)
        client.send(req)
        resp = recvs.get(timeout=WAIT)
        done = sends.get(timeout=WAIT)
        out["order"] = order[:2]
        out["send_status"] = done.status.name
        out["resp_linked"] = resp.request is req and resp.send_context1 == "req12648430"
        out["resp_payload"] = bytes(resp.mad[24:29]).decode()
        out["resp_tid_low"] = int.from_bytes(resp.mad[12:16], "big")
        out["resp_method"] = resp.mad[3]
        put_mad([resp, req])

        seq = request(GET, 0x5E0)
        got = transact(client, seq, timeout=WAIT)
        out["transact_payload"] = bytes(got.mad[24:29]).decode()
        put_mad([got, seq])

        slow = request(SEND, 0xCA7)  # a Send nobody serves: no answer comes
        client.send(slow)
        client.cancel(slow)
        out["cancel_status"] = sends.get(timeout=WAIT).status.name
        try:
            client.cancel(slow)
            out["second_cancel"] = "accepted"
        except IbError as exc:
            out["second_cancel"] = exc.status.name

        odd = reg_mad_svc(alias, MadSvc(0x0B, 1, recvs.put, sends.put))
        stray = odd.pool_key.get_mad()
        stray.mad[0:4] = bytes([1, 0x0B, 1, GET])
        stray.addr, stray.resp_expected, stray.timeout_ms = here, True, 1000
        odd.send(stray)
        reply = recvs.get(timeout=WAIT)
        out["unserved_status"] = int.from_bytes(reply.mad[4:6], "big")
        out["unserved_send"] = sends.get(timeout=WAIT).status.name

        # the server's class, a method it does not serve: answered by the kernel too
        unserved_method = request(SET, 0x5E7)
        client.send(unserved_method)
        reply = recvs.get(timeout=WAIT)
        out["unserved_method_status"] = int.from_bytes(reply.mad[4:6], "big")
        out["unserved_method_linked"] = reply.request is unserved_method
        out["unserved_method_send"] = sends.get(timeout=WAIT).status.name

        from mad_flood import flood  # next to this file: on sys.path as the script's dir

        out["flood"] = flood(alias, here, 0x0A)

        pending = request(SEND, 0xDEAD)
        client.send(pending)
        client.deregister(lambda _ctx: order.append("destroyed"), wait=True)
        out["dereg_status"] = sends.get(timeout=WAIT).status.name
        out["dereg_last"] = order[-1]
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
