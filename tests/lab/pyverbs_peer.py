"""What the lab guest's pyverbs scripts share: rxe0's verbs objects, RC connection, the TCP line.

Imported by the ``pyverbs_*.py`` scripts, which run in the guest with Debian's python3;
the host copies this file beside them (``PEER_LIB`` in the lab tests), so a plain
``import pyverbs_peer`` finds it in the script's directory.
"""

import json
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

PORT_NUM = 1
GID_INDEX = 1  # the IPv4-mapped GID of rxe0 on its netdev
RW = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def rc_qp(pd: PD, cq: CQ, send_wr: int = 16, recv_wr: int = 16) -> QP:
    """An RC QP with one SGE each way, both queues on ``cq``."""
    cap = QPCap(max_send_wr=send_wr, max_recv_wr=recv_wr, max_send_sge=1, max_recv_sge=1)
    return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))


def zeroed_mr(pd: PD, size: int, access: int) -> MR:
    mr = MR(pd, size, access)
    mr.write(bytes(size), size)
    return mr


def connect(qp: QP, access: int, dgid: GID, dest_qpn: int, *, mtu: int = e.IBV_MTU_1024,
            min_rnr_timer: int = 12, timeout: int = 14, rnr_retry: int = 7, rd_atomic: int = 4,
            hop_limit: int = 64) -> None:
    """RESET -> INIT -> RTR -> RTS towards ``dest_qpn`` at ``dgid``, PSN 0 both ways."""
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
    attr.port_num = PORT_NUM
    attr.pkey_index = 0
    attr.qp_access_flags = access
    qp.to_init(attr)
    gr = GlobalRoute(dgid=dgid, sgid_index=GID_INDEX, hop_limit=hop_limit)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT_NUM)
    attr.path_mtu = mtu
    attr.dest_qp_num = dest_qpn
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = rd_atomic
    attr.min_rnr_timer = min_rnr_timer
    qp.to_rtr(attr)
    attr.sq_psn = 0
    attr.timeout = timeout
    attr.retry_cnt = 7
    attr.rnr_retry = rnr_retry
    attr.max_rd_atomic = rd_atomic
    qp.to_rts(attr)


def signaled(wr_id: int, opcode: int, mr: MR, offset: int, length: int) -> SendWR:
    """A signalled one-SGE send WR over ``mr[offset:offset+length]``."""
    return SendWR(wr_id=wr_id, opcode=opcode, num_sge=1,
                  sg=[SGE(mr.buf + offset, length, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)


def wait_wc(cq: CQ, seconds: float = 60) -> Any:
    """The next completion on ``cq``; exits the script if none comes in ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        n, wcs = cq.poll()
        if n:
            return wcs[0]
        if time.monotonic() > deadline:
            raise SystemExit(f"no completion within {seconds:g} s")


class Line:
    """The host's TCP control connection: JSON lines out, commands in."""

    def __init__(self, port: int) -> None:
        listener = socket.create_server(("0.0.0.0", port))
        self.conn, _ = listener.accept()
        listener.close()
        self.rfile = self.conn.makefile("r")

    def say(self, obj: object) -> None:
        self.conn.sendall((json.dumps(obj) + "\n").encode())

    def exchange(self, ctx: Context, mr: MR, **mine: object) -> Any:
        """Send ``mine`` with this side's GID and ``mr``'s address and rkey; the host's reply."""
        gid = ctx.query_gid(PORT_NUM, GID_INDEX)
        self.say({**mine, "gid": str(gid), "vaddr": mr.buf, "rkey": mr.rkey})
        return json.loads(self.rfile.readline())

    def serve(self, handlers: dict[str, Callable[..., object]]) -> None:
        """Answer each command line with its handler's JSON (string arguments) until ``quit``."""
        self.say({"ready": True})
        for text in self.rfile:
            cmd, *args = text.split()
            if cmd == "quit":
                break
            self.say(handlers[cmd](*args))
        print("OK")
