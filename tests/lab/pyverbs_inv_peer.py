"""Guest side of test_rxe_interop_lab's invalidate test: two pyverbs RC QPs on kernel rxe.

Run in the lab guest as ``pyverbs_inv_peer.py PORT`` with Debian's python3.
Listens on TCP PORT, sends ``{"qpns": [Q0, Q1], "gid", "vaddr", "rkey"}``,
reads the host's ``{"qpns": [...], "gid"}``, connects QP i to the host's QP i
(PSN 0 both ways), says ``{"ready": true}``, then answers commands:

- ``bind``: post a receive on QP 0, bind a type 2 window over 4096 bytes at
  16384 of the buffer (remote read and write) with an ``IBV_WR_BIND_MW`` on
  QP 0: ``{"status": S, "opcode": OP, "rkey": NEW}``;
- ``recv``: the receive's completion: ``{"status", "with_inv", "inv_rkey", "len",
  "flags"}`` (``flags``: the raw ``wc_flags``);
- ``sendinv RKEY``: ``IBV_WR_SEND_WITH_INV`` of 16 bytes on QP 1: ``{"status"}``;
- ``write RKEY VA``: an 8-byte RDMA WRITE on QP 1: ``{"status"}``;
- ``dump OFFSET LENGTH``: ``{"data": HEX}``;
- ``quit``.
"""

import json
import socket
import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR, MW, MWBindInfo
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

PORT_NUM = 1
GID_INDEX = 1  # the IPv4-mapped GID of rxe0 on eth0
BUF = 64 * 1024
SCRATCH = 49152
WINDOW = 16384

ctx = Context(name="rxe0")
pd = PD(ctx)
cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
cqs = [CQ(ctx, 64, None, None, 0) for _ in range(2)]
qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)) for cq in cqs]
access = (
    e.IBV_ACCESS_LOCAL_WRITE
    | e.IBV_ACCESS_REMOTE_WRITE
    | e.IBV_ACCESS_REMOTE_READ
    | e.IBV_ACCESS_MW_BIND
)
mr = MR(pd, BUF, access)
mr.write(bytes(BUF), BUF)
mw = MW(pd, e.IBV_MW_TYPE_2)

listener = socket.create_server(("0.0.0.0", int(sys.argv[1])))
conn, _ = listener.accept()
rfile = conn.makefile("r")


def say(obj: object) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


gid = ctx.query_gid(PORT_NUM, GID_INDEX)
say({"qpns": [q.qp_num for q in qps], "gid": str(gid), "vaddr": mr.buf, "rkey": mr.rkey})
peer = json.loads(rfile.readline())

for qp, dest in zip(qps, peer["qpns"], strict=True):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
    attr.port_num = PORT_NUM
    attr.pkey_index = 0
    attr.qp_access_flags = access & ~e.IBV_ACCESS_MW_BIND
    qp.to_init(attr)
    gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=GID_INDEX, hop_limit=64)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT_NUM)
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num = dest
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = 4
    attr.min_rnr_timer = 12
    qp.to_rtr(attr)
    attr.sq_psn = 0
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.max_rd_atomic = 4
    qp.to_rts(attr)
say({"ready": True})


def poll(cq: CQ) -> object:
    deadline = time.monotonic() + 60
    while True:
        n, wcs = cq.poll()
        if n:
            return wcs[0]
        if time.monotonic() > deadline:
            raise SystemExit("no completion within 60 s")


def sge(offset: int, length: int) -> SGE:
    return SGE(mr.buf + offset, length, mr.lkey)


def bind() -> dict[str, object]:
    qps[0].post_recv(RecvWR(wr_id=100, num_sge=1, sg=[sge(0, 64)]))
    new = (mw.rkey & 0xFFFFFF00) | ((mw.rkey + 1) & 0xFF)  # ibv_inc_rkey, as set_bind_wr does
    wr = SendWR(wr_id=7, opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
    info = MWBindInfo(mr, mr.buf + WINDOW, 4096,
                      e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
    wr.set_bind_wr(mw, info)
    qps[0].post_send(wr)
    wc = poll(cqs[0])
    return {"status": int(wc.status), "opcode": int(wc.opcode), "rkey": new}


def recv() -> dict[str, object]:
    wc = poll(cqs[0])
    with_inv = bool(wc.wc_flags & e.IBV_WC_WITH_INV)
    # imm_data shares its union with invalidated_rkey (host order)
    return {"status": int(wc.status), "with_inv": with_inv, "inv_rkey": int(wc.imm_data),
            "len": int(wc.byte_len), "flags": int(wc.wc_flags)}


def sendinv(rkey: int) -> dict[str, object]:
    mr.write(b"invalidate yours", 16, SCRATCH)
    wr = SendWR(wr_id=8, opcode=e.IBV_WR_SEND_WITH_INV, num_sge=1, sg=[sge(SCRATCH, 16)],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.imm_data = rkey  # the union's invalidate_rkey
    qps[1].post_send(wr)
    return {"status": int(poll(cqs[1]).status)}


def write(rkey: int, va: int) -> dict[str, object]:
    mr.write(b"kernelrx", 8, SCRATCH + 64)
    wr = SendWR(wr_id=9, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge(SCRATCH + 64, 8)],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(rkey, va)
    qps[1].post_send(wr)
    return {"status": int(poll(cqs[1]).status)}


for line in rfile:
    cmd = line.split()
    if cmd[0] == "bind":
        say(bind())
    elif cmd[0] == "recv":
        say(recv())
    elif cmd[0] == "sendinv":
        say(sendinv(int(cmd[1])))
    elif cmd[0] == "write":
        say(write(int(cmd[1]), int(cmd[2])))
    elif cmd[0] == "dump":
        say({"data": mr.read(int(cmd[2]), int(cmd[1])).hex()})
    elif cmd[0] == "quit":
        break
print("OK")
