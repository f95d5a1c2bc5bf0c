"""Guest side of test_rxe_faults_lab: one pyverbs RC QP on kernel rxe moving bulk data.

Run in the lab guest as ``pyverbs_bulk_peer.py PORT SIZE RNR_RETRY [MTU [TIMEOUT]]`` with
Debian's python3 (MTU 256..4096, default 1024; above 1024 it first raises
eth0's MTU to 9000, since rxe's path MTU must fit the netdev's).  Its buffer is
2 * SIZE bytes: [0, SIZE) what it sends,
[SIZE, 2 * SIZE) where the host's data lands (the host's buffer has the same
layout).  Listens on TCP PORT, sends its QP as one JSON line (qpn, gid,
vaddr, rkey), reads the host's, connects (PSN 0 both ways, ``rnr_retry`` =
RNR_RETRY), says ``{"ready": true}``, then answers commands line by line, each
with one JSON line:

- ``netem ARGS...``: ``tc qdisc replace dev eth0 root netem ARGS`` → ``rc``;
- ``fill SEED``: random bytes into [0, SIZE) → ``sha``;
- ``hash OFFSET LENGTH`` → ``sha`` (sha256 of that part of the buffer);
- ``recv N LENGTH``: post N receives, the i-th at SIZE + i * LENGTH;
- ``wait N SECONDS``: poll N completions, then 1 s more for any extra one →
  ``wcs`` ([wr_id, status, byte_len] each), ``extra``;
- ``post write|send N LENGTH``: N signalled WRITEs (to the host's
  SIZE + i * LENGTH) or SENDs of [i * LENGTH, +LENGTH), at most 16 in flight,
  → ``wcs``, ``secs``;
- ``quit``.
"""

import hashlib
import random
import subprocess
import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")

import pyverbs.enums as e
from pyverbs.addr import GID
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.wr import SGE, RecvWR, SendWR
from pyverbs_peer import PORT_NUM, RW, Line, connect, rc_qp, zeroed_mr

WINDOW = 16
SIZE = int(sys.argv[2])
RNR_RETRY = int(sys.argv[3])
MTU = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
TIMEOUT = int(sys.argv[5]) if len(sys.argv) > 5 else 12  # local ACK timeout exponent
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}[MTU]  # enum ibv_mtu
if MTU > 1024:
    subprocess.run(["ip", "link", "set", "eth0", "mtu", "9000"], check=True)

ctx = Context(name="rxe0")
deadline = time.monotonic() + 10
while ctx.query_port(PORT_NUM).active_mtu < MTU_ENUM:  # rxe follows the netdev notifier
    assert time.monotonic() < deadline, "rxe0 never took eth0's new MTU"
    time.sleep(0.05)
pd = PD(ctx)
cq = CQ(ctx, 1024, None, None, 0)
qp = rc_qp(pd, cq, send_wr=WINDOW, recv_wr=512)
mr = zeroed_mr(pd, 2 * SIZE, RW)

line = Line(int(sys.argv[1]))
peer = line.exchange(ctx, mr, qpn=qp.qp_num)
connect(qp, RW, GID(peer["gid"]), peer["qpn"], mtu=MTU_ENUM, min_rnr_timer=1,
        timeout=TIMEOUT, rnr_retry=RNR_RETRY)


def sha(off: int, n: int) -> str:
    return hashlib.sha256(mr.read(n, off)).hexdigest()


def poll(n: int, seconds: float) -> list[list[int]]:
    got: list[list[int]] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        k, wcs = cq.poll(num_entries=n - len(got))
        got += [[int(w.wr_id), int(w.status), int(w.byte_len)] for w in wcs[:k]]
    return got


def post(op: str, n: int, length: int) -> dict[str, object]:
    start = time.monotonic()
    wcs: list[list[int]] = []
    posted = 0
    while len(wcs) < n:
        while posted < n and posted - len(wcs) < WINDOW:
            wr = SendWR(
                wr_id=posted,
                opcode=e.IBV_WR_RDMA_WRITE if op == "write" else e.IBV_WR_SEND,
                num_sge=1,
                sg=[SGE(mr.buf + posted * length, length, mr.lkey)],
                send_flags=e.IBV_SEND_SIGNALED,
            )
            if op == "write":
                wr.set_wr_rdma(peer["rkey"], peer["vaddr"] + SIZE + posted * length)
            qp.post_send(wr)
            posted += 1
        got = poll(1, 180)
        if not got:
            break  # no completion within 180 s: report what came
        wcs += got
        if got[0][1] != 0:
            wcs += poll(n, 5)  # the flushed rest
            break
    return {"wcs": wcs, "secs": time.monotonic() - start}


def netem(*args: str) -> dict[str, object]:
    subprocess.run(["modprobe", "sch_netem"], check=False)
    tc = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *args]
    return {"rc": subprocess.run(tc, check=False).returncode}


def fill(seed: str) -> dict[str, object]:
    mr.write(random.Random(int(seed)).randbytes(SIZE), SIZE, 0)
    return {"sha": sha(0, SIZE)}


def recv(n: str, length: str) -> dict[str, object]:
    size = int(length)
    for i in range(int(n)):
        sge = SGE(mr.buf + SIZE + i * size, size, mr.lkey)
        qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[sge]))
    return {"posted": int(n)}


def wait(n: str, seconds: str) -> dict[str, object]:
    wcs = poll(int(n), float(seconds))
    return {"wcs": wcs, "extra": len(poll(1, 1.0))}


line.serve({
    "netem": netem,
    "fill": fill,
    "hash": lambda off, n: {"sha": sha(int(off), int(n))},
    "recv": recv,
    "wait": wait,
    "post": lambda op, n, length: post(op, int(n), int(length)),
})
