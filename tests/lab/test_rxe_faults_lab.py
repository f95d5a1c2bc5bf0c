"""Faults between the ibal rxe provider on the host and kernel rxe in the lab guest.

Same link as test_rxe_interop_lab: an ibal rxe device on the tap address in
the lab's namespace, a pyverbs RC QP (tests/lab/pyverbs_bulk_peer.py) on the
guest's kernel ``rxe0``.  The host kernel here has no ``sch_netem``, so the
impairment (``netem loss 5% reorder 25% 50% duplicate 1% delay 1ms``) sits on
the guest's eth0 egress (Debian's kernel has netem): frames from kernel rxe
(data when the guest sends, ACKs/NAKs when ibal sends) are lost, duplicated,
reordered and delayed.

Size: each direction moves SIZE (32 MiB; 100 MiB, the issue's size, with
``IBAL_LAB_FAULT_FULL=1``, which takes 6-8 minutes here; ``IBAL_LAB_FAULT_MIB``
overrides both; under netem half as RDMA WRITEs, half as SENDs) in 256 KiB messages
(``IBAL_LAB_FAULT_CHUNK_KIB``) at path MTU 4096 (``IBAL_LAB_FAULT_MTU``; above
1024 both ends of the link get netdev MTU 9000): kernel rxe's go-back-N
requester is what takes the time in the TCG guest, and it costs per packet.
Content is checked by sha256 on both sides; every work request must complete
exactly once, successfully.

One guest boot (2 CPUs) for the module; a fresh guest QP per test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from guest_peers import start_peer

from ibal.al import AlManager, QpCreate
from ibal.lab import Lab, LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import (
    RcTiming,
    active_port,
    drain,
    mr_access,
    to_init,
    to_rtr,
    to_rts,
    wait_wcs,
)
from ibal.testing.helpers import Side as QpSide
from ibal.types import AvAttr, Gid, Grh, Mtu, QpState, QpType, RecvWr, SendWr, WcStatus, WrType

pytestmark = pytest.mark.lab

PORT = 18620
FULL = os.environ.get("IBAL_LAB_FAULT_FULL", "") not in ("", "0")  # the 100 MiB
SIZE = int(os.environ.get("IBAL_LAB_FAULT_MIB", "100" if FULL else "32")) << 20
MTU = int(os.environ.get("IBAL_LAB_FAULT_MTU", "4096"))
CHUNK = int(os.environ.get("IBAL_LAB_FAULT_CHUNK_KIB", "256")) << 10
COUNT = SIZE // CHUNK
WINDOW = 16
NETEM = "loss 5% reorder 25% 50% duplicate 1% delay 1ms"
FIGURES: dict[str, Any] = {}  # printed at the end of the module (pytest -s) for the docs


def _unavailable(reason: str) -> None:
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{reason} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def link(ibal_lab: Lab) -> Iterator[LabSession]:
    lab_requires("net", "pyverbs")
    if shutil.which("tc") is None:
        _unavailable("tc missing (apt-get install iproute2)")
    if os.geteuid() != 0:
        _unavailable("the rxe provider's raw sockets need root")
    lab = Lab(kernel=ibal_lab.kernel_spec, cache_dir=ibal_lab.cache_dir, cpus=2, memory_mb=2048)
    with lab.session(net=True) as s:
        if MTU > 1024:  # room for 4096-byte RoCE payloads on the host's end of the link
            cfg = s.net_config
            assert cfg is not None and s.netns_name is not None
            ip = ["ip", "-n", s.netns_name, "link", "set", cfg.tap, "mtu", "9000"]
            subprocess.run(ip, check=True)
        yield s
    if FIGURES:
        print("\nrxe fault figures:", json.dumps(FIGURES, indent=1))


class GuestPeer:
    """The pyverbs QP in the guest, driven over its TCP line protocol."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("r")

    def ask(self, cmd: str) -> Any:
        self.sock.sendall((cmd + "\n").encode())
        line = self.rfile.readline()
        assert line, f"the guest peer closed the connection after {cmd!r}"
        return json.loads(line)


@dataclass
class Link:
    side: QpSide
    peer: GuestPeer
    rva: int  # the guest buffer's address and rkey
    rkey: int


@contextlib.contextmanager
def connected(
    s: LabSession, *, rnr_retry: int = 7, guest_rnr_retry: int = 7, size: int = SIZE,
    guest_timeout: int = 12,
) -> Iterator[Link]:
    """A fresh guest peer and an ibal RC QP connected to it (2 * size buffers each).

    ``guest_timeout``: kernel rxe's local ACK timeout exponent (12: 16 ms).
    """
    cfg = s.net_config
    assert cfg is not None
    host_ip, guest_ip = cfg.host_ip, cfg.guest_ip
    job = start_peer(s, "pyverbs_bulk_peer.py", PORT, size, guest_rnr_retry, MTU, guest_timeout,
                     timeout=1800)
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: None if job.done() else job.kill())
        with s.in_netns():  # the device's sockets and the TCP link live in the namespace
            mgr = AlManager()
            stack.callback(mgr.close)
            mgr.add_provider(RxeProvider({"devices": f"rxe0={host_ip}"}))
            sock = job.connect(guest_ip, PORT, io_timeout=300)
        stack.callback(sock.close)
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        port = active_port(ca.query().ports)
        assert port is not None
        pd = ca.alloc_pd()
        cq = ca.create_cq(1024)
        buf = bytearray(2 * size)
        mr = pd.reg_mem(buf, mr_access(ca.capabilities))
        qp = pd.create_qp(
            QpCreate(QpType.RC, send_cq=cq, recv_cq=cq, sq_depth=WINDOW, rq_depth=COUNT)
        )
        side = QpSide(ca=ca, port=port, pd=pd, cq=cq, buf=buf, mr=mr, qp=qp)
        peer = GuestPeer(sock)
        info = json.loads(peer.rfile.readline())
        gid = port.gid_table[0].gid
        assert gid == Gid(f"::ffff:{host_ip}")
        peer.sock.sendall((json.dumps({"qpn": qp.num, "gid": gid.exploded, "vaddr": mr.vaddr,
                                       "rkey": mr.rkey}) + "\n").encode())  # fmt: skip
        timing = RcTiming(rnr_retry_cnt=rnr_retry, local_ack_timeout=12)
        to_init(qp, port.port_num, mr.access)
        av = AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(info["gid"])))
        to_rtr(qp, av, Mtu[f"MTU_{MTU}"], info["qpn"], timing=timing)
        to_rts(qp, timing=timing)
        assert json.loads(peer.rfile.readline()) == {"ready": True}
        yield Link(side, peer, info["vaddr"], info["rkey"])
        assert peer.ask("netem delay 0ms") == {"rc": 0}
        peer.sock.sendall(b"quit\n")
        r = job.wait()
        assert r.returncode == 0 and r.stdout_text.strip() == "OK", r.stderr_text


def _sha(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def ibal_sends(link: Link, op: WrType, count: int) -> float:
    """ibal posts ``count`` WRITEs or SENDs of CHUNK from offset 0, WINDOW in flight."""
    side = link.side
    start = time.monotonic()
    posted = 0
    done: list[int] = []
    while len(done) < count:
        while posted < count and posted - len(done) < WINDOW:
            wr: dict[str, Any] = {}
            if op is WrType.RDMA_WRITE:
                wr = {"remote_addr": link.rva + SIZE + posted * CHUNK, "rkey": link.rkey}
            side.qp.post_send(
                SendWr(wr_id=posted, opcode=op, sg_list=[side.sge(posted * CHUNK, CHUNK)], **wr)
            )
            posted += 1
        for wc in wait_wcs(side.cq, 1, timeout=180):
            assert wc.status is WcStatus.SUCCESS, (len(done), wc)
            done.append(wc.wr_id)
    secs = time.monotonic() - start
    assert done == list(range(count))  # each WR completed once, in order
    assert drain(side.cq) == []
    return secs


def _counters(side: QpSide) -> dict[str, int]:
    return {k: v for k, v in side.ca.query_port_counters(side.port.port_num).items() if v}


def host_to_guest(link: Link, op: WrType, seed: int, count: int = COUNT) -> dict[str, Any]:
    side, peer = link.side, link.peer
    data = random.Random(seed).randbytes(count * CHUNK)
    side.put(0, data)
    if op is WrType.SEND:
        assert peer.ask(f"recv {count} {CHUNK}") == {"posted": count}
    secs = ibal_sends(link, op, count)
    if op is WrType.SEND:
        res = peer.ask(f"wait {count} 60")
        assert res["extra"] == 0 and len(res["wcs"]) == count, res
        assert res["wcs"] == [[i, 0, CHUNK] for i in range(count)]
    assert peer.ask(f"hash {SIZE} {len(data)}")["sha"] == _sha(data)
    return {"secs": round(secs, 1)}


def guest_to_host(link: Link, op: str, seed: int, count: int = COUNT) -> dict[str, Any]:
    side, peer = link.side, link.peer
    n = count * CHUNK
    peer.ask(f"fill {seed}")
    want = peer.ask(f"hash 0 {n}")["sha"]
    if op == "send":
        for i in range(count):
            side.qp.post_recv(RecvWr(wr_id=i, sg_list=[side.sge(SIZE + i * CHUNK, CHUNK)]))
    res = peer.ask(f"post {op} {count} {CHUNK}")
    # Kernel rxe reports the length for WRITE completions too.
    assert res["wcs"] == [[i, 0, CHUNK] for i in range(count)], (res["wcs"][-3:], _counters(side))
    if op == "send":
        wcs = wait_wcs(side.cq, count, timeout=60)
        assert [(w.wr_id, w.status, w.length) for w in wcs] == [
            (i, WcStatus.SUCCESS, CHUNK) for i in range(count)
        ]
        assert drain(side.cq) == []
    assert _sha(side.get(SIZE, n)) == want
    return {"secs": round(res["secs"], 1)}


@pytest.mark.timeout(900)
def test_clean_transfer_both_ways(link: LabSession) -> None:
    """No impairment: the baseline the netem figures compare with.

    Kernel rxe's ACK timeout is 268 ms here, not 16 ms: on a clean link its
    timeouts are only ever the host's late ACKs, and Debian 12's rxe can
    renumber a WRITE when an ACK lands during such a retry
    (tests/providers/rxe/test_rxe_kernel_quirks.py).  Under netem the timeout
    is what recovers a lost retransmission, so it stays at 16 ms there.
    """
    with connected(link, guest_timeout=16) as c:
        before = _counters(c.side)
        half = COUNT // 2  # the size of each netem WRITE run
        FIGURES["clean ibal WRITE"] = host_to_guest(c, WrType.RDMA_WRITE, 1, half)
        FIGURES["clean guest WRITE"] = guest_to_host(c, "write", 2, half)
        FIGURES["clean counters"] = {k: v - before.get(k, 0) for k, v in _counters(c.side).items()}


@pytest.mark.timeout(1800)
def test_netem_transfers_byte_exact_both_ways(link: LabSession) -> None:
    with connected(link) as c:
        assert c.peer.ask(f"netem {NETEM}") == {"rc": 0}
        before = _counters(c.side)
        half = COUNT // 2  # each direction: SIZE, half as WRITEs, half as SENDs
        FIGURES["netem ibal WRITE"] = host_to_guest(c, WrType.RDMA_WRITE, 3, half)
        FIGURES["netem ibal SEND"] = host_to_guest(c, WrType.SEND, 4, COUNT - half)
        FIGURES["netem guest WRITE"] = guest_to_host(c, "write", 5, half)
        FIGURES["netem guest SEND"] = guest_to_host(c, "send", 6, COUNT - half)
        FIGURES["netem counters"] = {k: v - before.get(k, 0) for k, v in _counters(c.side).items()}


@pytest.mark.timeout(600)
def test_rnr_retry_exhausted_when_kernel_rxe_posts_no_receive(link: LabSession) -> None:
    """ibal SENDs to a guest QP with no receive: RNR NAKs, 2 retries, then RNR_RETRY_ERR."""
    with connected(link, rnr_retry=2, size=CHUNK) as c:
        side = c.side
        before = _counters(side)
        side.qp.post_send(SendWr(wr_id=7, opcode=WrType.SEND, sg_list=[side.sge(0, 100)]))
        [wc] = wait_wcs(side.cq, 1, timeout=60)
        assert (wc.wr_id, wc.status) == (7, WcStatus.RNR_RETRY_ERR), wc
        assert side.qp.query().state is QpState.ERROR
        assert drain(side.cq) == []
        got = {k: v - before.get(k, 0) for k, v in _counters(side).items()}
        FIGURES["rnr ibal requester"] = got
        assert (got.get("rcvd_rnr_err"), got.get("retry_rnr_exceeded_err")) == (3, 1), got
        res = c.peer.ask("wait 1 1")
        assert res == {"wcs": [], "extra": 0}, res  # nothing reached the guest's CQ


@pytest.mark.timeout(600)
def test_rnr_retry_exhausted_when_ibal_posts_no_receive(link: LabSession) -> None:
    """Kernel rxe SENDs to an ibal QP with no receive: ibal RNR-NAKs until the guest gives up."""
    # kernel rxe's ACK timeout well above its RNR waits: a timeout retry in between
    # would be RNR-NAKed too (seen once at 16 ms: 4 NAKs)
    with connected(link, guest_rnr_retry=2, size=CHUNK, guest_timeout=16) as c:
        side = c.side
        before = _counters(side)
        res = c.peer.ask(f"post send 1 {CHUNK}")
        assert res["wcs"] == [[0, 13, 0]], res  # IBV_WC_RNR_RETRY_EXC_ERR
        got = {k: v - before.get(k, 0) for k, v in _counters(side).items()}
        FIGURES["rnr ibal responder"] = got
        assert got.get("send_rnr_err", 0) == 3  # the first try and 2 retries, each NAKed
        assert drain(side.cq) == []
