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

import sys

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import GID
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.wr import SendWR
from pyverbs_peer import RW, Line, connect, rc_qp, signaled, wait_wc, zeroed_mr

BUF = 128 * 1024
SCRATCH = 49152


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed * 13 + (i >> 8)) & 0xFF for i in range(n))


ctx = Context(name="rxe0")
pd = PD(ctx)
cq = CQ(ctx, 64, None, None, 0)
qp = rc_qp(pd, cq)
access = RW | e.IBV_ACCESS_REMOTE_ATOMIC
mr = zeroed_mr(pd, BUF, access)
mr.write(pattern(9000, 5), 9000, 4096)
mr.write((100).to_bytes(8, "little"), 8, 32768)

line = Line(int(sys.argv[1]))
peer = line.exchange(ctx, mr, qpn=qp.qp_num)
connect(qp, access, GID(peer["gid"]), peer["qpn"])


def run(wr: SendWR) -> int:
    qp.post_send(wr)
    return int(wait_wc(cq).status)


def ops() -> dict[str, object]:
    rva, rkey = peer["vaddr"], peer["rkey"]
    status = []
    mr.write(pattern(5000, 6), 5000, SCRATCH)
    wr = signaled(1, e.IBV_WR_RDMA_WRITE, mr, SCRATCH, 5000)
    wr.set_wr_rdma(rkey, rva + 16384)
    status.append(run(wr))
    wr = signaled(2, e.IBV_WR_RDMA_READ, mr, SCRATCH + 8192, 9000)
    wr.set_wr_rdma(rkey, rva + 4096)
    status.append(run(wr))
    wr = signaled(3, e.IBV_WR_ATOMIC_CMP_AND_SWP, mr, SCRATCH + 20480, 8)
    wr.set_wr_atomic(rkey, rva + 32768, 100, 0x1122334455667788)
    status.append(run(wr))
    wr = signaled(4, e.IBV_WR_ATOMIC_CMP_AND_SWP, mr, SCRATCH + 20488, 8)
    wr.set_wr_atomic(rkey, rva + 32768, 100, 0xDEAD)  # compare fails: no swap
    status.append(run(wr))
    wr = signaled(5, e.IBV_WR_ATOMIC_FETCH_AND_ADD, mr, SCRATCH + 20496, 8)
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


line.serve({
    "dump": lambda off, n: {"data": mr.read(int(n), int(off)).hex()},
    "ops": ops,
})
