"""The far end of test_rxe_two_processes: one rxe device in its own process.

Run as ``python3 rxe_peer.py DEVICES``.  Prints one JSON line with its RC QP
(number, GID, buffer address and R_Key), reads the parent's QP as one JSON
line, connects, posts one receive, prints ``{"ready": true}``, then answers
commands line by line: ``recv`` (wait for the receive, print its bytes),
``dump OFFSET LENGTH`` (print buffer bytes), ``quit``.
"""

from __future__ import annotations

import json
import sys

from ibal.al import AlManager
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import active_port, make_side, to_init, to_rtr, to_rts, wait_wc
from ibal.types import AvAttr, Gid, Grh, Mtu, QpType, RecvWr

BUF = 64 * 1024


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed * 13 + (i >> 8)) & 0xFF for i in range(n))


def main() -> None:
    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": sys.argv[1]}))
    al = mgr.open_al()
    ca = al.open_ca(al.get_ca_guids()[0])
    port = active_port(ca.query().ports)
    assert port is not None
    side = make_side(ca, port, QpType.RC, buf_size=BUF)
    side.put(4096, pattern(9000, 1))  # what the parent READs
    side.put(32768, (100).to_bytes(8, "little"))  # the atomics' target
    gid = port.gid_table[0].gid
    out = {"qpn": side.qp.num, "gid": str(gid), "vaddr": side.mr.vaddr, "rkey": side.mr.rkey}
    print(json.dumps(out), flush=True)
    peer = json.loads(sys.stdin.readline())
    access = side.mr.access
    to_init(side.qp, port.port_num, access)
    av = AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(peer["gid"])))
    to_rtr(side.qp, av, Mtu.MTU_1024, peer["qpn"])
    to_rts(side.qp)
    side.qp.post_recv(RecvWr(wr_id=7, sg_list=[side.sge(0, 2048)]))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "recv":
            wc = wait_wc(side.cq)
            data = side.get(0, wc.length).hex()
            print(json.dumps({"status": wc.status.name, "wr_id": wc.wr_id, "data": data}),
                  flush=True)
        elif cmd[0] == "dump":
            off, n = int(cmd[1]), int(cmd[2])
            print(json.dumps({"data": side.get(off, n).hex()}), flush=True)
        else:
            break
    mgr.close()


if __name__ == "__main__":
    main()
