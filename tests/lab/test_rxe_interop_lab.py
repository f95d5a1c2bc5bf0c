"""The ibal rxe provider on the host against kernel rxe in the lab guest.

The host end is an ibal rxe device bound to the tap's address inside the lab's
namespace; the guest runs the unmodified ``ibv_rc_pingpong`` /
``ibv_ud_pingpong`` and a pyverbs QP on its kernel ``rxe0``.  Kernel rxe drops
frames with a bad ICRC silently, so every exchange that completes proves the
provider's send path, and the provider checks the ICRC of every frame it takes.

One guest boot (2 CPUs) for the module.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from guest_peers import start_peer

from ibal.al import AlManager
from ibal.lab import Lab, LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import Side as QpSide
from ibal.testing.helpers import active_port, make_side, to_init, to_rtr, to_rts, wait_wc
from ibal.types import (
    AccessFlags,
    AvAttr,
    BindWr,
    Gid,
    Grh,
    Mtu,
    QpType,
    RecvOpt,
    SendWr,
    WcStatus,
    WcType,
    WrType,
)

pytestmark = pytest.mark.lab

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PP_PORT = 18515
RDMA_PORT = 18600


def _unavailable(reason: str) -> None:
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{reason} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(reason)


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        _unavailable(f"{tool} missing (apt-get install {package})")


@pytest.fixture(scope="module")
def link(ibal_lab: Lab) -> Iterator[LabSession]:
    lab_requires("net", "pyverbs")
    _need("ibv_rc_pingpong", "ibverbs-utils")
    _need("ss", "iproute2")
    if os.geteuid() != 0:
        _unavailable("the rxe provider's raw sockets need root")
    lab = Lab(kernel=ibal_lab.kernel_spec, cache_dir=ibal_lab.cache_dir, cpus=2)
    with lab.session(net=True) as s:
        yield s


def _addrs(s: LabSession) -> tuple[str, str]:
    cfg = s.net_config
    assert cfg is not None
    return cfg.host_ip, cfg.guest_ip


# ------------------------------------------------------------------ pingpong


def _ibal(s: LabSession, ud: bool) -> list[str]:
    host_ip, _ = _addrs(s)
    # One address: its IPv4-mapped GID is index 0 of the ibal device.
    return [sys.executable, "-m", "ibal.cli", "pingpong", "--provider", "rxe",
            "-o", f"devices=rxe0={host_ip}", "-d", "rxe0", "-g", "0",
            *(["--ud"] if ud else [])]  # fmt: skip


@dataclass
class Side:
    rc: int
    out: str
    err: str


def _host_listening(s: LabSession, port: int) -> bool:
    r = s.host_run(["ss", "-Hltn", f"sport = :{port}"], timeout=30, text=True)
    return str(port) in r.stdout


def ibal_server(s: LabSession, ibal: list[str], theirs: list[str]) -> tuple[Side, Side]:
    """ibal pingpong serves on the host, the real tool connects from the guest."""
    host_ip, _ = _addrs(s)
    srv = s.host_popen(ibal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    while not _host_listening(s, PP_PORT):  # polled, with a bound: the server is starting
        assert srv.poll() is None and time.monotonic() < deadline, srv.communicate()
        time.sleep(0.1)
    cli = s.run([*theirs, host_ip], timeout=240)
    try:
        out, err = srv.communicate(timeout=240 if cli.returncode == 0 else 10)
    except subprocess.TimeoutExpired:
        srv.kill()
        out, err = srv.communicate()
    return Side(srv.returncode, out, err), Side(cli.returncode, cli.stdout_text, cli.stderr_text)


def ibv_server(s: LabSession, ibal: list[str], theirs: list[str]) -> tuple[Side, Side]:
    """The real tool serves in the guest, ibal pingpong connects from the host."""
    _, guest_ip = _addrs(s)
    srv = s.guest_start(theirs, timeout=300)
    deadline = time.monotonic() + 60
    while True:  # retried while the guest's server is not listening yet (bounded)
        cli = s.host_run([*ibal, guest_ip], timeout=240, text=True, cwd=REPO)
        if cli.returncode == 0 or "Couldn't connect" not in cli.stderr:
            break
        assert not srv.done() and time.monotonic() < deadline, cli.stderr
        time.sleep(0.2)
    if cli.returncode != 0 and not srv.done():
        srv.kill()
    r = srv.wait()
    theirs_side = Side(r.returncode, r.stdout_text, r.stderr_text)
    return theirs_side, Side(cli.returncode, cli.stdout, cli.stderr)


ADDR = re.compile(
    r"(local|remote) address: +LID 0x[0-9a-f]{4}, QPN 0x([0-9a-f]{6}), PSN 0x([0-9a-f]{6})[,:] "
    r"GID (\S+)"
)


def check(server: Side, client: Side, size: int, iters: int, host_ip: str, guest_ip: str) -> None:
    for name, side in (("server", server), ("client", client)):
        assert side.rc == 0, f"{name} exited {side.rc}: {side.err}\n{side.out}"
        assert f"{size * iters * 2} bytes in " in side.out, side.out
        assert re.search(rf"^{iters} iters in [0-9.]+ seconds = [0-9.]+ usec/iter$", side.out, re.M)
    srv = {m[0]: m[1:] for m in ADDR.findall(server.out)}
    cli = {m[0]: m[1:] for m in ADDR.findall(client.out)}
    assert srv["remote"] == cli["local"] and cli["remote"] == srv["local"]
    gids = {ipaddress.IPv6Address(srv["local"][2]), ipaddress.IPv6Address(cli["local"][2])}
    want = {ipaddress.IPv6Address(f"::ffff:{ip}") for ip in (host_ip, guest_ip)}
    assert gids == want


def pingpong_both_ways(s: LabSession, tool: str, sizes: list[int]) -> None:
    host_ip, guest_ip = _addrs(s)
    for size in sizes:
        iters = 3 if size >= 1 << 20 else 10
        args = ["-s", str(size), "-n", str(iters)]
        ibal = _ibal(s, tool == "ibv_ud_pingpong") + args
        theirs = [tool, "-d", "rxe0", "-g", "1", *args]
        for run in (ibal_server, ibv_server):
            server, client = run(s, ibal, theirs)
            try:
                check(server, client, size, iters, host_ip, guest_ip)
            except AssertionError as exc:
                raise AssertionError(f"{run.__name__} {tool} -s {size}: {exc}") from None


@pytest.mark.timeout(1800)
def test_rc_pingpong_ibal_rxe_and_kernel_rxe_both_ways(link: LabSession) -> None:
    pingpong_both_ways(link, "ibv_rc_pingpong", [1, 4096, 65536, 1 << 20])


@pytest.mark.timeout(900)
def test_ud_pingpong_ibal_rxe_and_kernel_rxe_both_ways(link: LabSession) -> None:
    pingpong_both_ways(link, "ibv_ud_pingpong", [1, 1024])


# ------------------------------------------------------------ RDMA with pyverbs


def pattern(n: int, seed: int) -> bytes:
    """The guest script's pattern (same formula)."""
    return bytes((i * 7 + seed * 13 + (i >> 8)) & 0xFF for i in range(n))


class GuestPeer:
    """The pyverbs QP in the guest, driven over its TCP line protocol."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("r")

    def read(self) -> Any:
        line = self.rfile.readline()
        assert line, "the guest peer closed the connection"
        return json.loads(line)

    def write(self, obj: object) -> None:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        self.sock.sendall((text + "\n").encode())

    def dump(self, off: int, n: int) -> bytes:
        self.write(f"dump {off} {n}")
        return bytes.fromhex(self.read()["data"])


def _post(side: QpSide, **wr: Any) -> None:
    side.qp.post_send(SendWr(wr_id=1, **wr))
    wc = wait_wc(side.cq, timeout=60)
    assert (wc.status, wc.wr_id) == (WcStatus.SUCCESS, 1), wc


def _word(data: bytes) -> int:
    return int.from_bytes(data, "little")


@pytest.mark.timeout(600)
def test_rdma_write_read_atomics_with_pyverbs_on_kernel_rxe(link: LabSession) -> None:
    s = link
    host_ip, guest_ip = _addrs(s)
    job = start_peer(s, "pyverbs_rdma_peer.py", RDMA_PORT)
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: None if job.done() else job.kill())
        with s.in_netns():  # the device's sockets and the TCP link live in the namespace
            mgr = AlManager()
            stack.callback(mgr.close)
            mgr.add_provider(RxeProvider({"devices": f"rxe0={host_ip}"}))
            sock = job.connect(guest_ip, RDMA_PORT)
        stack.callback(sock.close)
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        port = active_port(ca.query().ports)
        assert port is not None
        side = make_side(ca, port, QpType.RC, buf_size=128 * 1024)
        side.put(4096, pattern(9000, 7))  # what the guest READs
        side.put(32768, (100).to_bytes(8, "little"))  # the guest's atomics' target
        peer = GuestPeer(sock)
        info = peer.read()
        gid = port.gid_table[0].gid
        assert gid == Gid(f"::ffff:{host_ip}")
        peer.write({"qpn": side.qp.num, "gid": gid.exploded, "vaddr": side.mr.vaddr,
                    "rkey": side.mr.rkey})  # fmt: skip
        to_init(side.qp, port.port_num, side.mr.access)
        av = AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(info["gid"])))
        to_rtr(side.qp, av, Mtu.MTU_1024, info["qpn"])
        to_rts(side.qp)
        assert peer.read() == {"ready": True}
        rva, rkey = info["vaddr"], info["rkey"]

        # ibal requests, kernel rxe responds.
        data = pattern(5000, 3)  # five packets at MTU 1024
        side.put(49152, data)
        _post(side, opcode=WrType.RDMA_WRITE, sg_list=[side.sge(49152, len(data))],
              remote_addr=rva + 16384, rkey=rkey)  # fmt: skip
        assert peer.dump(16384, len(data) + 16) == data + bytes(16)  # not a byte further
        _post(side, opcode=WrType.RDMA_READ, sg_list=[side.sge(57344, 9000)],
              remote_addr=rva + 4096, rkey=rkey)  # fmt: skip
        assert side.get(57344, 9000) == pattern(9000, 5)
        _post(side, opcode=WrType.COMPARE_SWAP, sg_list=[side.sge(69632, 8)],
              remote_addr=rva + 32768, rkey=rkey, compare_add=100, swap=7)  # fmt: skip
        _post(side, opcode=WrType.COMPARE_SWAP, sg_list=[side.sge(69640, 8)],
              remote_addr=rva + 32768, rkey=rkey, compare_add=100, swap=9)  # fmt: skip
        _post(side, opcode=WrType.FETCH_ADD, sg_list=[side.sge(69648, 8)],
              remote_addr=rva + 32768, rkey=rkey, compare_add=5)  # fmt: skip
        old = [_word(side.get(69632 + 8 * i, 8)) for i in range(3)]
        assert old == [100, 7, 7]  # swapped, missed (no swap), then added to
        assert _word(peer.dump(32768, 8)) == 12

        # Kernel rxe requests, ibal responds.
        peer.write("ops")
        res = peer.read()
        assert res["status"] == [0] * 5, res["status"]  # IBV_WC_SUCCESS
        assert side.get(16384, 5016) == pattern(5000, 6) + bytes(16)
        assert bytes.fromhex(res["read"]) == pattern(9000, 7)
        swapped = 0x1122334455667788
        assert (res["cas_hit"], res["cas_miss"], res["faa"]) == (100, swapped, swapped)
        assert _word(side.get(32768, 8)) == swapped + 0x10
        peer.write("quit")
        r = job.wait()
        assert r.returncode == 0 and r.stdout_text.strip() == "OK", r.stderr_text


# ------------------------------------------------- invalidate, both ways, with pyverbs

IBV_WC_REM_ACCESS_ERR = 10
IBV_WC_BIND_MW = 5
IBV_WC_WITH_INV = 1 << 3
KERNEL_RXE_WITH_INV = 1 << 2


def _one(side: QpSide, **wr: Any) -> Any:
    side.qp.post_send(SendWr(wr_id=2, **wr))
    return wait_wc(side.cq, timeout=60)


@pytest.mark.timeout(600)
def test_send_with_invalidate_both_ways_with_pyverbs_on_kernel_rxe(link: LabSession) -> None:
    """Type 2 windows on both ends: a SEND with invalidate from one side kills the other's
    window (the receiver sees it invalidated, with the R_Key) and a later WRITE with that
    R_Key fails REM_ACCESS_ERR; ibal -> kernel rxe on one QP pair, kernel rxe -> ibal on another."""
    s = link
    host_ip, guest_ip = _addrs(s)
    job = start_peer(s, "pyverbs_inv_peer.py", RDMA_PORT + 1)
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: None if job.done() else job.kill())
        with s.in_netns():
            mgr = AlManager()
            stack.callback(mgr.close)
            mgr.add_provider(RxeProvider({"devices": f"rxe0={host_ip}"}))
            sock = job.connect(guest_ip, RDMA_PORT + 1)
        stack.callback(sock.close)
        al = mgr.open_al()
        ca = al.open_ca(al.get_ca_guids()[0])
        port = active_port(ca.query().ports)
        assert port is not None
        sides = [make_side(ca, port, QpType.RC, buf_size=64 * 1024) for _ in range(2)]
        peer = GuestPeer(sock)
        info = peer.read()
        gid = port.gid_table[0].gid
        peer.write({"qpns": [x.qp.num for x in sides], "gid": gid.exploded})
        av = AvAttr(port_num=port.port_num, grh=Grh(dgid=Gid(info["gid"])))
        for x, qpn in zip(sides, info["qpns"], strict=True):
            to_init(x.qp, port.port_num, x.mr.access)
            to_rtr(x.qp, av, Mtu.MTU_1024, qpn)
            to_rts(x.qp)
        assert peer.read() == {"ready": True}
        a, b = sides
        window = info["vaddr"] + 16384

        # ibal -> kernel rxe: the guest binds a type 2 window; ibal writes through it,
        # then invalidates it with a SEND.
        peer.write("bind")
        bound = peer.read()
        assert (bound["status"], bound["opcode"]) == (0, IBV_WC_BIND_MW), bound
        rkey_g = bound["rkey"]
        a.put(0, b"via window")
        wc = _one(a, opcode=WrType.RDMA_WRITE, sg_list=[a.sge(0, 10)],
                  remote_addr=window + 100, rkey=rkey_g)  # fmt: skip
        assert wc.status is WcStatus.SUCCESS, wc
        assert peer.dump(16384 + 100, 10) == b"via window"
        a.put(64, b"goodbye window")
        wc = _one(a, opcode=WrType.SEND_WITH_INV, sg_list=[a.sge(64, 14)],
                  invalidate_rkey=rkey_g)  # fmt: skip
        assert (wc.wc_type, wc.status) == (WcType.SEND, WcStatus.SUCCESS), wc
        peer.write("recv")
        got = peer.read()
        assert (got["status"], got["inv_rkey"], got["len"]) == (0, rkey_g, 14), got
        # Kernel rxe (6.1) writes the kernel's IB_WC_WITH_INVALIDATE (1 << 2) into the user
        # CQ, where libibverbs reads IBV_WC_IP_CSUM_OK; verbs' IBV_WC_WITH_INV is 1 << 3.
        assert got["flags"] & (IBV_WC_WITH_INV | KERNEL_RXE_WITH_INV), got
        assert peer.dump(0, 14) == b"goodbye window"
        wc = _one(a, opcode=WrType.RDMA_WRITE, sg_list=[a.sge(0, 10)],
                  remote_addr=window + 200, rkey=rkey_g)  # fmt: skip
        assert wc.status is WcStatus.REM_ACCESS_ERR, wc
        assert peer.dump(16384 + 200, 10) == bytes(10)

        # kernel rxe -> ibal: ibal binds a type 2 window on its second QP; the guest
        # writes through it, then invalidates it with a SEND.
        mw = b.pd.create_mw(2)
        rkey_h = (mw.rkey & ~0xFF) | ((mw.rkey + 1) & 0xFF)
        wc = _one(b, opcode=WrType.BIND_MW, rkey=rkey_h, mw=mw,
                  bind=BindWr(b.mr, b.mr.vaddr + 8192, 4096,
                              AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ, mw.rkey))  # fmt: skip
        assert (wc.wc_type, wc.status) == (WcType.MW_BIND, WcStatus.SUCCESS), wc
        b.recv(100, 0, 64)
        peer.write(f"write {rkey_h} {b.mr.vaddr + 8192 + 8}")
        assert peer.read() == {"status": 0}
        assert b.get(8192 + 8, 8) == b"kernelrx"
        peer.write(f"sendinv {rkey_h}")
        assert peer.read() == {"status": 0}
        wc = wait_wc(b.cq, timeout=60)
        assert (wc.wr_id, wc.status, wc.length) == (100, WcStatus.SUCCESS, 16), wc
        assert wc.recv_opt & RecvOpt.INVALIDATE and wc.invalidated_rkey == rkey_h, wc
        assert b.get(0, 16) == b"invalidate yours"
        peer.write(f"write {rkey_h} {b.mr.vaddr + 8192 + 64}")
        assert peer.read() == {"status": IBV_WC_REM_ACCESS_ERR}
        assert b.get(8192 + 64, 8) == bytes(8)
        peer.write("quit")
        r = job.wait()
        assert r.returncode == 0 and r.stdout_text.strip() == "OK", r.stderr_text
