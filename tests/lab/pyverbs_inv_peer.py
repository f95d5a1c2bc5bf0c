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

import sys

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import GID
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MW, MWBindInfo
from pyverbs.pd import PD
from pyverbs.wr import SGE, RecvWR, SendWR
from pyverbs_peer import RW, Line, connect, rc_qp, signaled, wait_wc, zeroed_mr

BUF = 64 * 1024
SCRATCH = 49152
WINDOW = 16384

ctx = Context(name="rxe0")
pd = PD(ctx)
cqs = [CQ(ctx, 64, None, None, 0) for _ in range(2)]
qps = [rc_qp(pd, cq) for cq in cqs]
mr = zeroed_mr(pd, BUF, RW | e.IBV_ACCESS_MW_BIND)
mw = MW(pd, e.IBV_MW_TYPE_2)

line = Line(int(sys.argv[1]))
peer = line.exchange(ctx, mr, qpns=[q.qp_num for q in qps])
for qp, dest in zip(qps, peer["qpns"], strict=True):
    connect(qp, RW, GID(peer["gid"]), dest)


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
    wc = wait_wc(cqs[0])
    return {"status": int(wc.status), "opcode": int(wc.opcode), "rkey": new}


def recv() -> dict[str, object]:
    wc = wait_wc(cqs[0])
    with_inv = bool(wc.wc_flags & e.IBV_WC_WITH_INV)
    # imm_data shares its union with invalidated_rkey (host order)
    return {"status": int(wc.status), "with_inv": with_inv, "inv_rkey": int(wc.imm_data),
            "len": int(wc.byte_len), "flags": int(wc.wc_flags)}


def sendinv(rkey: str) -> dict[str, object]:
    mr.write(b"invalidate yours", 16, SCRATCH)
    wr = signaled(8, e.IBV_WR_SEND_WITH_INV, mr, SCRATCH, 16)
    wr.imm_data = int(rkey)  # the union's invalidate_rkey
    qps[1].post_send(wr)
    return {"status": int(wait_wc(cqs[1]).status)}


def write(rkey: str, va: str) -> dict[str, object]:
    mr.write(b"kernelrx", 8, SCRATCH + 64)
    wr = signaled(9, e.IBV_WR_RDMA_WRITE, mr, SCRATCH + 64, 8)
    wr.set_wr_rdma(int(rkey), int(va))
    qps[1].post_send(wr)
    return {"status": int(wait_wc(cqs[1]).status)}


line.serve({
    "bind": bind,
    "recv": recv,
    "sendinv": sendinv,
    "write": write,
    "dump": lambda off, n: {"data": mr.read(int(n), int(off)).hex()},
})
