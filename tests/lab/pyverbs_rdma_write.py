"""Guest-side smoke test: two RC QPs on rxe0, one RDMA WRITE, check the bytes landed.

Run by test_lab_verbs.py inside the lab guest with Debian's /usr/bin/python3.
Prints one line "OK <n> bytes" on success; any failure raises.
"""

import sys

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs_peer import GID_INDEX, PORT_NUM, connect, rc_qp, signaled, wait_wc, zeroed_mr

SIZE = 4096
PATTERN = bytes((i * 7 + 3) & 0xFF for i in range(SIZE))

ctx = Context(name=sys.argv[1] if len(sys.argv) > 1 else "rxe0")
port = ctx.query_port(PORT_NUM)
assert port.state == e.IBV_PORT_ACTIVE, f"port state {port.state}"
gid = ctx.query_gid(PORT_NUM, GID_INDEX)  # ::ffff:127.0.0.1, rxe0's RoCE v2 entry on lo
pd = PD(ctx)
cq = CQ(ctx, 16, None, None, 0)
qps = [rc_qp(pd, cq, send_wr=4, recv_wr=4) for _ in range(2)]
access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
src = zeroed_mr(pd, SIZE, access)
dst = zeroed_mr(pd, SIZE, access)
src.write(PATTERN, SIZE)

# each QP towards the other on the same port, as a remote peer would
connect(qps[0], access, gid, qps[1].qp_num, hop_limit=1, rd_atomic=1)
connect(qps[1], access, gid, qps[0].qp_num, hop_limit=1, rd_atomic=1)

wr = signaled(42, e.IBV_WR_RDMA_WRITE, src, 0, SIZE)
wr.set_wr_rdma(dst.rkey, dst.buf)
qps[0].post_send(wr)
wc = wait_wc(cq, 30)
assert wc.status == e.IBV_WC_SUCCESS, f"completion status {wc.status}"
assert wc.wr_id == 42, wc.wr_id
assert wc.opcode == e.IBV_WC_RDMA_WRITE, wc.opcode
landed = dst.read(SIZE, 0)
assert landed == PATTERN, "RDMA WRITE data mismatch"
print(f"OK {SIZE} bytes qpn={qps[0].qp_num}->{qps[1].qp_num}")
