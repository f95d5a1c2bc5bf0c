"""Guest side of make_rxe_golden.py's responses: a kernel-rxe RC QP waiting for requests.

Runs inside the lab guest as ``rxe_golden_responder.py HOST_IP HOST_QPN RQ_PSN INFO_FILE``.
Writes ``qpn rkey addr`` to INFO_FILE once the QP is in RTS with a receive
posted; the host then sends it requests built by ibal's encoder, and the
kernel answers them (it drops frames whose ICRC is wrong, silently).  After the
host writes ``check`` into INFO_FILE + ".go", prints what landed in memory.
"""

import ipaddress
import os
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
from pyverbs.wr import SGE, RecvWR

PORT, GID_INDEX = 1, 1
host_ip, host_qpn, rq_psn, info = sys.argv[1], int(sys.argv[2], 0), int(sys.argv[3], 0), sys.argv[4]
ctx = Context(name="rxe0")
pd = PD(ctx)
cq = CQ(ctx, 64, None, None, 0)
access = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
mr = MR(pd, 4096, access)
mr.write(bytes((i * 7 + 3) & 0xFF for i in range(4096)), 4096)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                       cap=QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)))
attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
attr.port_num, attr.pkey_index, attr.qp_access_flags = PORT, 0, access
qp.to_init(attr)
dgid = GID(ipaddress.IPv6Address("::ffff:" + host_ip).exploded)
attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=dgid, sgid_index=GID_INDEX, hop_limit=64),
                      is_global=1, port_num=PORT)
attr.path_mtu = e.IBV_MTU_256
attr.dest_qp_num = host_qpn
attr.rq_psn = rq_psn
attr.max_dest_rd_atomic = 4
attr.min_rnr_timer = 12
qp.to_rtr(attr)
attr.sq_psn = 0
attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
qp.to_rts(attr)
qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf + 3072, 1024, mr.lkey)]))
with open(info + ".tmp", "w") as f:
    f.write(f"{qp.qp_num} {mr.rkey} {mr.buf}\n")
os.rename(info + ".tmp", info)

deadline = time.monotonic() + 100
while not os.path.exists(info + ".go") and time.monotonic() < deadline:
    time.sleep(0.2)
n, wcs = cq.poll()
print("wc", [(w.wr_id, w.status, w.byte_len) for w in wcs[:n]] if n else [])
print("send", mr.read(16, 3072).hex())
print("write", mr.read(16, 2048).hex())
print("atomic", mr.read(8, 1024).hex())
