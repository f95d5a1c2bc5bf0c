"""The far end of test_rxe_shmid: one rxe device in its own process that registers a
shared-memory segment by name (``ib_reg_shmid``).

Run as ``python3 rxe_shmid_peer.py DEVICES SHMID``.  Prints one JSON line with its
RC QP (number, GID) and the registration's address and R_Key, reads the parent's
QP as one JSON line, connects, prints ``{"ready": true}``, then waits for ``quit``.
"""

from __future__ import annotations

import json
import sys

from ibal.al import AlManager
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import active_port, make_side, to_init, to_rtr, to_rts
from ibal.types import AccessFlags, AvAttr, Gid, Grh, Mtu, QpType


def main() -> None:
    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": sys.argv[1]}))
    al = mgr.open_al()
    ca = al.open_ca(al.get_ca_guids()[0])
    port = active_port(ca.query().ports)
    assert port is not None
    side = make_side(ca, port, QpType.RC, buf_size=4096)
    shm = side.pd.reg_shmid(sys.argv[2], AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
    gid = port.gid_table[0].gid
    print(json.dumps({"qpn": side.qp.num, "gid": str(gid), "vaddr": shm.vaddr,
                      "rkey": shm.rkey}), flush=True)  # fmt: skip
    peer = json.loads(sys.stdin.readline())
    to_init(side.qp, port.port_num, side.mr.access)
    to_rtr(side.qp, AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(peer["gid"]))),
           Mtu.MTU_1024, peer["qpn"])  # fmt: skip
    to_rts(side.qp)
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # "quit"
    shm.dereg()
    mgr.close()


if __name__ == "__main__":
    main()
