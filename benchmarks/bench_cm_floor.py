"""The floor of a Python CM: the least work any Python CM must do, against kernel rdma_cm.

Two processes exchange a connection's CM messages as RoCEv2 datagrams over
UDP (REQ, REP, RTU to connect; DREQ, DREP to disconnect), every REQ sent
before any answer is read and every DREQ likewise, as ``cmtime`` does.  No
QP is created or modified, there is no state machine, no timer, no lock and
no thread: only what no Python CM can skip.  Two levels:

* ``io``: each datagram pre-built; per message one comm ID patched in, the
  ICRC computed (``zlib.crc32``), one ``sendto``/``recv_into``;
* ``codec``: the same plus each message encoded and the answer decoded with
  the CM's field tables' compiled codecs (``Table.pack``/``unpack``, no
  checks): the least a CM that reads what it receives does.

Meant for the lab guest, beside the kernel's own ``cmtime`` in the same boot
(``--kernel ADDR`` runs ``cmtime -b ADDR`` and ``cmtime -s ADDR -c N``
first), so that Python and the kernel are compared on the same emulated CPUs::

    ibal lab run --net --cpus 2 -- python3 benchmarks/bench_cm_floor.py \
        --kernel 10.99.0.2 --runs 5

Printed per run: connect and disconnect totals in ms for each level and for
the kernel, and the rates' ratios (floor / kernel, >1: the floor is faster).
On the host alone (no ``--kernel``) it prints the floor's figures only.

ibal's own CM in the same boot (its rxe devices need UDP 4791, which the
kernel's rxe holds until its module is unloaded)::

    ibal lab run --net --cpus 2 -- sh -c "ip link set lo up; \
        python3 benchmarks/bench_cm_floor.py --kernel 10.99.0.2 --runs 5; \
        rdma link delete rxe0; modprobe -r rdma_rxe; \
        python3 benchmarks/bench_cm_host.py --runs 3"
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ibal.cm.wire import TABLES  # noqa: E402
from ibal.wire.mad.consts import CmAttr  # noqa: E402
from ibal.wire.mad.header import MAD_HEADER  # noqa: E402

HOST = "127.0.0.1"
CLIENT_PORT, SERVER_PORT = 18515, 18516
HDR = 12 + 8  # BTH + DETH: the UD header of a QP1 datagram
MAD = 256
DATA_OFF = 24  # the CM's data area within the MAD
SIZE = HDR + MAD + 4  # + ICRC
COMM_ID = struct.Struct(">I")  # local comm ID: the first field of every CM message
ANSWER = {CmAttr.REQ: CmAttr.REP, CmAttr.DREQ: CmAttr.DREP}
NEXT = {CmAttr.REP: CmAttr.RTU}  # the client's answer to the server's answer


def template(attr: CmAttr) -> bytearray:
    """One CM message as a RoCEv2 UD datagram on QP1, ICRC left to :func:`finish`."""
    buf = bytearray(SIZE)
    buf[0] = 0x64  # BTH opcode: UD SEND only
    struct.pack_into(">HH", buf, 2, 0xFFFF, 0)  # P_Key, reserved + dest QP high
    struct.pack_into(">I", buf, 4, 1)  # dest QP 1
    struct.pack_into(">II", buf, 12, 0x80010000, 1)  # DETH: Q_Key, source QP
    header = {"mgmt_class": 7, "class_version": 2, "method": 3, "attr_id": int(attr), "tid": 1}
    MAD_HEADER.pack_into(buf, HDR, *MAD_HEADER.check(header))
    return buf


def finish(buf: bytearray) -> bytearray:
    """The ICRC: a CRC-32 over the datagram (rxe masks a few header fields first; the
    cost is the CRC over every byte)."""
    struct.pack_into("<I", buf, SIZE - 4, zlib.crc32(memoryview(buf)[: SIZE - 4]))
    return buf


class Messages:
    """Builds and reads CM datagrams at one of the two levels."""

    def __init__(self, level: str) -> None:
        self.codec = level == "codec"
        self.templates = {a: template(a) for a in CmAttr if a in TABLES}
        # Decoded values of an all-zero message, as a CM would fill in before encoding.
        self.values = {a: TABLES[a].unpack(bytes(TABLES[a].size), 0) for a in self.templates}

    def build(self, attr: CmAttr, comm_id: int) -> bytearray:
        buf = bytearray(self.templates[attr])
        if self.codec:
            vals = list(self.values[attr])
            vals[0] = comm_id
            TABLES[attr].pack_into(buf, HDR + DATA_OFF, *vals)
        else:
            COMM_ID.pack_into(buf, HDR + DATA_OFF, comm_id)
        return finish(buf)

    def read(self, buf: memoryview) -> tuple[CmAttr, int]:
        """The message's attribute and local comm ID (decoded whole at the codec level)."""
        if zlib.crc32(buf[: SIZE - 4]) != struct.unpack_from("<I", buf, SIZE - 4)[0]:
            raise ValueError("bad ICRC")
        attr = CmAttr(struct.unpack_from(">H", buf, HDR + 16)[0])
        if self.codec:
            comm_id = TABLES[attr].unpack(buf, HDR + DATA_OFF)[0]
        else:
            comm_id = COMM_ID.unpack_from(buf, HDR + DATA_OFF)[0]
        return attr, comm_id


def serve(level: str) -> None:
    """The passive side: answers REQ with REP and DREQ with DREP, reads RTUs; forever."""
    msgs = Messages(level)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((HOST, SERVER_PORT))
    buf = bytearray(4096)
    view = memoryview(buf)
    print("ready", flush=True)
    while True:
        n = sock.recv_into(buf)
        if n != SIZE:
            continue
        attr, comm_id = msgs.read(view)
        answer = ANSWER.get(attr)
        if answer is not None:
            sock.sendto(msgs.build(answer, comm_id), (HOST, CLIENT_PORT))


def client(level: str, n: int, sock: socket.socket) -> tuple[float, float]:
    """One run: connect ``n`` (REQ out, REP in, RTU out) and disconnect them (DREQ out,
    DREP in); the two steps' seconds."""
    msgs = Messages(level)
    dest = (HOST, SERVER_PORT)
    buf = bytearray(4096)
    view = memoryview(buf)

    def step(send: CmAttr, answer: CmAttr) -> None:
        """Every ``send`` out, then each ``answer`` read (and replied to, if NEXT says)."""
        for i in range(n):
            sock.sendto(msgs.build(send, i), dest)
        left = n
        while left:
            sock.recv_into(buf)
            attr, comm_id = msgs.read(view)
            if attr is answer:
                reply = NEXT.get(attr)
                if reply is not None:
                    sock.sendto(msgs.build(reply, comm_id), dest)
                left -= 1

    t0 = time.perf_counter()
    step(CmAttr.REQ, CmAttr.REP)
    t1 = time.perf_counter()
    step(CmAttr.DREQ, CmAttr.DREP)
    return t1 - t0, time.perf_counter() - t1


def kernel(addr: str, n: int) -> tuple[float, float]:
    """The kernel's ``cmtime -c n`` against a fresh ``cmtime`` server on ``addr``."""
    from bench_cm import steps  # cmtime's table parser

    server = subprocess.Popen(["cmtime", "-b", addr], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        show = ["rdma", "res", "show", "cm_id"]
        while "state LISTEN" not in subprocess.run(show, capture_output=True, text=True).stdout:
            # bounded poll: the server is starting
            if time.monotonic() > deadline:
                raise SystemExit("the kernel's cmtime server did not listen")
            time.sleep(0.1)
        out = subprocess.run(["cmtime", "-s", addr, "-c", str(n)], capture_output=True,
                             text=True, timeout=300, check=True).stdout  # fmt: skip
    finally:
        server.kill()
        server.wait()
    t = steps(out)
    return t["connect"], t["disconnect"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kernel", metavar="ADDR", help="also run the kernel's cmtime on ADDR")
    ap.add_argument("--serve", choices=("io", "codec"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    n = args.connections
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((HOST, CLIENT_PORT))
    rows: dict[str, list[tuple[float, float]]] = {"kernel": [], "io": [], "codec": []}
    for run in range(args.runs):
        if args.kernel:
            rows["kernel"].append(kernel(args.kernel, n))
        for level in ("io", "codec"):
            srv = subprocess.Popen([sys.executable, __file__, "--serve", level],
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
            try:
                assert srv.stdout is not None
                if srv.stdout.readline().strip() != "ready":
                    raise SystemExit("the floor's server did not start")
                client(level, 10, sock)  # warm
                rows[level].append(client(level, n, sock))
            finally:
                srv.kill()
                srv.wait()
        print(f"run {run + 1}: " + ", ".join(
            f"{k} {v[-1][0] * 1e3:.1f}/{v[-1][1] * 1e3:.1f} ms" for k, v in rows.items() if v),
            flush=True)  # fmt: skip
    print(f"\n{n} connections per run, {args.runs} runs; connect / disconnect ms (median)")
    for k, v in rows.items():
        if not v:
            continue
        c, d = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
        line = f"{k:8s} {c * 1e3:8.1f} {d * 1e3:8.1f}"
        if rows["kernel"] and k != "kernel":
            rc = statistics.median(kk[0] / x[0] for kk, x in zip(rows["kernel"], v, strict=True))
            rd = statistics.median(kk[1] / x[1] for kk, x in zip(rows["kernel"], v, strict=True))
            line += f"   ratio to the kernel: connect {rc:.2f}, disconnect {rd:.2f}"
        print(line)


if __name__ == "__main__":
    main()
