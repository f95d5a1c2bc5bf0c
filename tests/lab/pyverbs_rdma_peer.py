"""Guest side of test_rxe_interop_lab's RDMA test: one pyverbs RC QP on kernel rxe.

Run in the lab guest as ``pyverbs_rdma_peer.py PORT`` with Debian's python3.
Listens on TCP PORT, sends its QP as one JSON line (qpn, gid, vaddr, rkey),
reads the host's, connects (PSN 0 both ways), says ``{"ready": true}``, then
answers commands line by line:

- ``dump OFFSET LENGTH``: ``{"data": HEX}`` of its buffer;
- ``ops``: RDMA WRITE, READ, compare-and-swap (a hit and a miss) and
  fetch-and-add against the host's buffer, ``{"status": [...], "read": HEX,
  "cas_hit": OLD, "cas_miss": OLD, "faa": OLD}``;
- ``quit``.

Buffer layout (both sides): 4096 +9000 bytes for the other side to READ,
16384 +5000 where the other side WRITEs, 32768 the atomic target (100),
49152.. local scratch for outgoing data and READ/atomic results.
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
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

PORT_NUM = 1
GID_INDEX = 1  # the IPv4-mapped GID of rxe0 on eth0
BUF = 128 * 1024
SCRATCH = 49152


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed * 13 + (i >> 8)) & 0xFF for i in range(n))


ctx = Context(name="rxe0")
pd = PD(ctx)
cq = CQ(ctx, 64, None, None, 0)
cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
access = (
    e.IBV_ACCESS_LOCAL_WRITE
    | e.IBV_ACCESS_REMOTE_WRITE
    | e.IBV_ACCESS_REMOTE_READ
    | e.IBV_ACCESS_REMOTE_ATOMIC
)
mr = MR(pd, BUF, access)
mr.write(bytes(BUF), BUF)
mr.write(pattern(9000, 5), 9000, 4096)
mr.write((100).to_bytes(8, "little"), 8, 32768)

listener = socket.create_server(("0.0.0.0", int(sys.argv[1])))
conn, _ = listener.accept()
rfile = conn.makefile("r")


def say(obj: object) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


gid = ctx.query_gid(PORT_NUM, GID_INDEX)
say({"qpn": qp.qp_num, "gid": str(gid), "vaddr": mr.buf, "rkey": mr.rkey})
peer = json.loads(rfile.readline())

attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
attr.port_num = PORT_NUM
attr.pkey_index = 0
attr.qp_access_flags = access
qp.to_init(attr)
gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=GID_INDEX, hop_limit=64)
attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT_NUM)
attr.path_mtu = e.IBV_MTU_1024
attr.dest_qp_num = peer["qpn"]
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


def post(wr_id: int, opcode: int, offset: int, length: int) -> SendWR:
    return SendWR(
        wr_id=wr_id,
        opcode=opcode,
        num_sge=1,
        sg=[SGE(mr.buf + offset, length, mr.lkey)],
        send_flags=e.IBV_SEND_SIGNALED,
    )


def run(wr: SendWR) -> int:
    qp.post_send(wr)
    deadline = time.monotonic() + 60
    while True:
        n, wcs = cq.poll()
        if n:
            return int(wcs[0].status)
        if time.monotonic() > deadline:
            raise SystemExit("no completion within 60 s")


def ops() -> dict[str, object]:
    rva, rkey = peer["vaddr"], peer["rkey"]
    status = []
    mr.write(pattern(5000, 6), 5000, SCRATCH)
    wr = post(1, e.IBV_WR_RDMA_WRITE, SCRATCH, 5000)
    wr.set_wr_rdma(rkey, rva + 16384)
    status.append(run(wr))
    wr = post(2, e.IBV_WR_RDMA_READ, SCRATCH + 8192, 9000)
    wr.set_wr_rdma(rkey, rva + 4096)
    status.append(run(wr))
    wr = post(3, e.IBV_WR_ATOMIC_CMP_AND_SWP, SCRATCH + 20480, 8)
    wr.set_wr_atomic(rkey, rva + 32768, 100, 0x1122334455667788)
    status.append(run(wr))
    wr = post(4, e.IBV_WR_ATOMIC_CMP_AND_SWP, SCRATCH + 20488, 8)
    wr.set_wr_atomic(rkey, rva + 32768, 100, 0xDEAD)  # compare fails: no swap
    status.append(run(wr))
    wr = post(5, e.IBV_WR_ATOMIC_FETCH_AND_ADD, SCRATCH + 20496, 8)
    wr.set_wr_atomic(rkey, rva + 32768, 0x10, 0)
    status.append(run(wr))

    def word(off: int) -> int:
        return int.from_bytes(mr.read(8, SCRATCH + off), "little")

    return {
        "status": status,
        "read": mr.read(9000, SCRATCH + 8192).hex(),
        "cas_hit": word(20480),
        "cas_miss": word(20488),
        "faa": word(20496),
    }


for line in rfile:
    cmd = line.split()
    if cmd[0] == "dump":
        say({"data": mr.read(int(cmd[2]), int(cmd[1])).hex()})
    elif cmd[0] == "ops":
        say(ops())
    elif cmd[0] == "quit":
        break
print("OK")
