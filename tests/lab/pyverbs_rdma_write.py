"""Guest-side smoke test: two RC QPs on rxe0, one RDMA WRITE, check the bytes landed.

Run by test_lab_verbs.py inside the lab guest with Debian's /usr/bin/python3.
Prints one line "OK <n> bytes" on success; any failure raises.
"""

import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

PORT = 1
GID_INDEX = 1  # ::ffff:127.0.0.1, the RoCE v2 IPv4 entry of rxe0 on lo
SIZE = 4096
PATTERN = bytes((i * 7 + 3) & 0xFF for i in range(SIZE))

ctx = Context(name=sys.argv[1] if len(sys.argv) > 1 else "rxe0")
port = ctx.query_port(PORT)
assert port.state == e.IBV_PORT_ACTIVE, f"port state {port.state}"
gid = ctx.query_gid(PORT, GID_INDEX)
pd = PD(ctx)
cq = CQ(ctx, 16, None, None, 0)
cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)) for _ in range(2)]
access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
src = MR(pd, SIZE, access)
dst = MR(pd, SIZE, access)
src.write(PATTERN, SIZE)
dst.write(bytes(SIZE), SIZE)


def connect(qp: QP, peer: QP) -> None:
    """INIT -> RTR -> RTS towards `peer` on the same port, as a remote peer would."""
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
    attr.port_num = PORT
    attr.pkey_index = 0
    attr.qp_access_flags = access
    qp.to_init(attr)
    gr = GlobalRoute(dgid=gid, sgid_index=GID_INDEX, hop_limit=1)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT)
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num = peer.qp_num
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    qp.to_rtr(attr)
    attr.sq_psn = 0
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.max_rd_atomic = 1
    qp.to_rts(attr)


connect(qps[0], qps[1])
connect(qps[1], qps[0])

wr = SendWR(
    wr_id=42,
    opcode=e.IBV_WR_RDMA_WRITE,
    num_sge=1,
    sg=[SGE(src.buf, SIZE, src.lkey)],
    send_flags=e.IBV_SEND_SIGNALED,
)
wr.set_wr_rdma(dst.rkey, dst.buf)
qps[0].post_send(wr)

deadline = time.monotonic() + 30
while True:
    n, wcs = cq.poll()
    if n:
        break
    if time.monotonic() > deadline:
        raise SystemExit("no completion within 30 s")
wc = wcs[0]
assert wc.status == e.IBV_WC_SUCCESS, f"completion status {wc.status}"
assert wc.wr_id == 42, wc.wr_id
assert wc.opcode == e.IBV_WC_RDMA_WRITE, wc.opcode
landed = dst.read(SIZE, 0)
assert landed == PATTERN, "RDMA WRITE data mismatch"
print(f"OK {SIZE} bytes qpn={qps[0].qp_num}->{qps[1].qp_num}")
