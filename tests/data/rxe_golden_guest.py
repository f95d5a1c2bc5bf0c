"""Guest side of make_rxe_golden.py: kernel rxe sends one request of every kind.

Runs inside the lab guest (Debian's /usr/bin/python3 with pyverbs) as
``rxe_golden_guest.py HOST_IP FAKE_QPN``.  RC, UC and UD QPs on rxe0 address a
QP number nobody owns on the host end of the lab link, so the requests go out
once and nothing answers; path MTU 256 keeps the multi-packet messages small.
Prints ``posted N`` once every work request is posted, then waits to be killed.
"""

import ipaddress
import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import AH, GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

PORT, GID_INDEX = 1, 1  # GID 1: ::ffff:<eth0's IPv4>
SQ_PSN = 0x00FFF0  # close to nothing special; the PSNs show in the frames
QKEY = 0x11111111
LONG, SHORT = 600, 20  # 600 bytes at MTU 256: FIRST, MIDDLE, LAST

host_ip, fake_qpn = sys.argv[1], int(sys.argv[2], 0)
ctx = Context(name="rxe0")
pd = PD(ctx)
cq = CQ(ctx, 256, None, None, 0)
access = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
mr = MR(pd, 8192, access)
mr.write(bytes((i * 13 + 1) & 0xFF for i in range(8192)), 8192)
dgid_hex = ipaddress.IPv6Address("::ffff:" + host_ip).exploded
gr = GlobalRoute(dgid=GID(dgid_hex), sgid_index=GID_INDEX, hop_limit=64)


def make_qp(qp_type: int) -> QP:
    cap = QPCap(max_send_wr=64, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=cap))
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
    attr.port_num, attr.pkey_index = PORT, 0
    if qp_type == e.IBV_QPT_UD:
        attr.qkey = QKEY
        qp.to_init(attr)
        qp.to_rtr(attr)
        attr.sq_psn = SQ_PSN
        qp.to_rts(attr)
        return qp
    attr.qp_access_flags = access
    qp.to_init(attr)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT)
    attr.path_mtu = e.IBV_MTU_256
    attr.dest_qp_num = fake_qpn
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    qp.to_rtr(attr)
    attr.sq_psn = SQ_PSN
    attr.timeout = 20  # 4 s: the frames of interest go out before any retry
    attr.retry_cnt = 1
    attr.rnr_retry = 0
    attr.max_rd_atomic = 16
    qp.to_rts(attr)
    return qp


def wr(wr_id: int, opcode: int, size: int, offset: int = 0) -> SendWR:
    w = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1,
               sg=[SGE(mr.buf + offset, size, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
    return w


posted = 0
for qp_type in (e.IBV_QPT_RC, e.IBV_QPT_UC):
    qp = make_qp(qp_type)
    ops = [(e.IBV_WR_SEND, LONG), (e.IBV_WR_SEND, SHORT),
           (e.IBV_WR_SEND_WITH_IMM, LONG), (e.IBV_WR_SEND_WITH_IMM, SHORT),
           (e.IBV_WR_RDMA_WRITE, LONG), (e.IBV_WR_RDMA_WRITE, SHORT),
           (e.IBV_WR_RDMA_WRITE_WITH_IMM, LONG), (e.IBV_WR_RDMA_WRITE_WITH_IMM, SHORT)]
    if qp_type == e.IBV_QPT_RC:
        ops += [(e.IBV_WR_RDMA_READ, LONG), (e.IBV_WR_ATOMIC_CMP_AND_SWP, 8),
                (e.IBV_WR_ATOMIC_FETCH_AND_ADD, 8),
                (e.IBV_WR_SEND_WITH_INV, LONG), (e.IBV_WR_SEND_WITH_INV, SHORT)]
    for i, (op, size) in enumerate(ops):
        w = wr(posted, op, size, 1024 + 8 * i if size == 8 else 0)
        if op in (e.IBV_WR_SEND_WITH_IMM, e.IBV_WR_RDMA_WRITE_WITH_IMM):
            w.imm_data = 0x1000 + i
        if op == e.IBV_WR_SEND_WITH_INV:
            w.imm_data = 0x00ABCD00 + i  # shares the union with invalidate_rkey
        if op in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_WRITE_WITH_IMM, e.IBV_WR_RDMA_READ):
            w.set_wr_rdma(0x12345678, 0x7F0000001000 + 0x1000 * i)
        if op == e.IBV_WR_ATOMIC_CMP_AND_SWP:
            w.set_wr_atomic(0x12345678, 0x7F0000002000, 0x1111, 0x2222)
        if op == e.IBV_WR_ATOMIC_FETCH_AND_ADD:
            w.set_wr_atomic(0x12345678, 0x7F0000002008, 5, 0)
        qp.post_send(w)
        posted += 1

ud = make_qp(e.IBV_QPT_UD)
ah = AH(pd, attr=AHAttr(gr=gr, is_global=1, port_num=PORT))
for i, op in enumerate((e.IBV_WR_SEND, e.IBV_WR_SEND_WITH_IMM)):
    w = wr(posted, op, SHORT)
    if op == e.IBV_WR_SEND_WITH_IMM:
        w.imm_data = 0x2000 + i
    w.set_wr_ud(ah, fake_qpn, QKEY)
    ud.post_send(w)
    posted += 1

print(f"posted {posted}", flush=True)
time.sleep(120)
