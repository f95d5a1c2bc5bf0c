"""Linux rdma_cm (librdmacm's rping over kernel rxe on the lab guest's eth0) as ibal sees it.

The facts the RDMA CM compatibility (ibal.cm.cma, ibal.cm.rdma) is built on,
checked against the real thing: rping works guest to guest on eth0 (not on
lo: rdma_cm resolves no route there), and the REQ a kernel ``rping -c`` sends
to the host end of the link decodes with ibal's CM tables and CMA header as
roce-wire.md 3.3/3.4 say.  One guest (``--net``) for the module.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from guest_peers import host_rxe
from rdma_cm_raw import RawCm, raw_accept, raw_connect

from ibal.al import AccessLayer, Pd, QpCreate
from ibal.cm import ConnectionRejected, cma, rdma
from ibal.cm.rdma import resolve_route
from ibal.cm.service import agent_of
from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.lab.vm import GuestJob
from ibal.status import InvalidState, Timeout
from ibal.testing.helpers import ServerThread
from ibal.tools.cmatose import CmatoseOptions
from ibal.tools.cmatose import run as cmatose
from ibal.tools.cmtime import CmtimeOptions, CmtimeServer, run_client
from ibal.tools.mckey import MckeyOptions
from ibal.tools.mckey import run as mckey
from ibal.tools.rping import RpingEndpoint
from ibal.tools.rping_proto import ping_text
from ibal.tools.udaddy import UdaddyError, UdaddyOptions
from ibal.tools.udaddy import run as udaddy
from ibal.types import (
    Gid,
    QpType,
)
from ibal.wire.iba import BTH, DETH
from ibal.wire.mad import cm
from ibal.wire.mad.cm import RejReason
from ibal.wire.mad.consts import CmAttr

pytestmark = pytest.mark.lab

RPING_PORT = 7174
IP_RECVTTL = 12  # linux/in.h (the socket module does not name it)
IP_TTL = 2


def _addrs(s: LabSession) -> tuple[str, str]:
    cfg = s.net_config
    assert cfg is not None
    return cfg.host_ip, cfg.guest_ip


@pytest.mark.timeout(300)
def test_rping_guest_to_guest_on_eth0(ibal_lab_module_net: LabSession) -> None:
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    # the server's buffer must be as large as the client's: -S on both
    server = s.guest_start(["rping", "-s", "-a", guest_ip, "-C", "3", "-S", "100", "-v", "-V"],
                           timeout=120)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # bounded retry while the server is not listening yet
            cli = s.run(["rping", "-c", "-a", guest_ip, "-C", "3", "-S", "100", "-v", "-V"],
                        timeout=60)  # fmt: skip
            if cli.returncode == 0 or server.done() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        srv = server.wait()
    finally:
        if not server.done():
            server.kill()
    assert cli.returncode == 0, cli.stderr_text
    assert srv.returncode == 0, srv.stderr_text
    lines = cli.stdout_text.splitlines()
    # the ping text: "rdma-ping-N: " then letters from 'A'+N, wrapping after 'z'
    assert lines[0].startswith("ping data: rdma-ping-0: ABCDEFGH")
    assert lines[2].startswith("ping data: rdma-ping-2: CDEFGHIJ")
    assert sum(line.startswith("server ping data: rdma-ping-") for line in
               srv.stdout_text.splitlines()) == 3  # fmt: skip


@pytest.mark.timeout(300)
def test_kernel_req_decodes_as_roce_wire_says(ibal_lab_module_net: LabSession) -> None:
    """The REQ of a guest ``rping -c`` to the host end, taken by a UDP socket on 4791."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, guest_ip = _addrs(s)
    with s.in_netns():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.closing(sock):
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        sock.bind((host_ip, 4791))
        job = s.guest_start(["rping", "-c", "-a", host_ip, "-C", "1"], timeout=60)
        try:
            ready, _, _ = select.select([sock], [], [], 45)
            assert ready, "no RoCE packet from the guest's rping -c"
            data, anc, _, (src_ip, src_port) = sock.recvmsg(4096, socket.CMSG_SPACE(4))
        finally:
            job.kill()
            job.wait()
    ttl = [struct.unpack("=i", d)[0] for lvl, typ, d in anc
           if (lvl, typ) == (socket.IPPROTO_IP, IP_TTL)]  # fmt: skip
    assert (src_ip, src_port, ttl) == (guest_ip, 0xD872, [64])  # roce-wire.md 3.4
    assert len(data) == 12 + 8 + 256 + 4
    bth, deth = BTH.decode(data), DETH.decode(data, 12)
    assert (bth["opcode"], bth["pkey"], bth["dest_qpn"]) == (0x64, 0xFFFF, 1)
    assert (deth["qkey"], deth["src_qpn"]) == (0x80010000, 1)

    msg = cm.parse_cm(data[20:276])
    assert msg.attr is CmAttr.REQ
    f = msg.fields
    comm_id = f["local_comm_id"]
    assert isinstance(comm_id, int)
    # TID: the comm ID as laid out in little-endian memory, under the agent's hi_tid
    assert msg.tid & 0xFFFFFFFF == int.from_bytes(comm_id.to_bytes(4, "little"), "big")
    assert f["service_id"] == cma.service_id(cma.PortSpace.TCP, RPING_PORT)
    guest_gid, host_gid = Gid(f"::ffff:{guest_ip}"), Gid(f"::ffff:{host_ip}")
    assert (f["primary_local_gid"], f["primary_remote_gid"]) == (guest_gid.packed, host_gid.packed)
    expect = {
        "primary_local_lid": 0xFFFF, "primary_remote_lid": 0xFFFF,  # permissive: hop limit > 1
        "primary_subnet_local": False, "primary_hop_limit": 64, "primary_traffic_class": 0,
        "primary_sl": 0, "path_mtu": 3, "pkey": 0xFFFF, "transport_type": cm.TransportType.RC,
        "remote_cm_response_timeout": 20, "local_cm_response_timeout": 20,
        "max_cm_retries": 15, "retry_count": 7, "rnr_retry_count": 7,
        "responder_resources": 1, "initiator_depth": 1, "local_qkey": 0,
        "alternate_local_lid": 0, "srq": False,
    }  # fmt: skip
    assert {k: f[k] for k in expect} == expect
    # cm_ack_timeout(rxe's ack delay 15, packet lifetime): 18 up to Linux 6.1, 16 later
    assert f["primary_local_ack_timeout"] in (19, 17)

    pdata = f["private_data"]
    assert isinstance(pdata, bytes)
    hdr, user = cma.split_private_data(pdata)
    assert (hdr.src, hdr.dst) == (ipaddress.IPv4Address(guest_ip), ipaddress.IPv4Address(host_ip))
    assert hdr.src_port in cma.EPHEMERAL_PORTS  # rdma_cm bound the client to a port
    assert user == bytes(56)  # rping sends no private data of its own
    assert pdata[:2] == b"\x00\x40"


# ------------------------------------------------ ibal rxe on the host, rping in the guest


@contextlib.contextmanager
def host_stack(s: LabSession) -> Iterator[tuple[AccessLayer, Pd, int, int]]:
    """ibal's rxe on the tap's address, in the lab's namespace: (AL, PD, CA GUID, port GUID)."""
    with host_rxe(s) as mgr:
        al = mgr.open_al()
        (guid,) = al.get_ca_guids()
        ca = al.open_ca(guid)
        port = ca.query().ports[0]
        yield al, ca.alloc_pd(), guid, port.port_guid


def _lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("size", "count"), [(64, 1), (4000, 100)])
def test_raw_cm_rping_client_against_guest_rping_server(
    ibal_lab_module_net: LabSession, size: int, count: int
) -> None:
    """ibal's rping client (CM by hand) against the unmodified ``rping -s``."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    server = s.guest_start(["rping", "-s", "-a", guest_ip, "-S", str(size), "-v"], timeout=240)
    try:
        with host_stack(s) as (al, pd, ca_guid, port_guid):
            route = resolve_route(al, guest_ip, port_guid=port_guid)
            end = RpingEndpoint(pd, size, client=True)
            end.init(route.port_num)
            end.post_recv()
            raw = RawCm(pd, port_guid)
            deadline = time.monotonic() + 60
            while True:  # bounded: REJ (no listener) while the guest's rping starts
                try:
                    conn = raw_connect(raw, end.qp, ca_guid, route, RPING_PORT,
                                       random.Random(size))  # fmt: skip
                    break
                except ConnectionRefusedError:
                    assert time.monotonic() < deadline and not server.done()
                    time.sleep(0.2)
            res = end.run(end.client_machine(count, verbose=True, validate=True),
                          disconnect=lambda: None, out=lambda _: None)  # fmt: skip
            drep = conn.disconnect()
            assert drep.fields["remote_comm_id"] == conn.local_comm_id
        r = server.wait()
    finally:
        if not server.done():
            server.kill()
    assert res.pings == count and len(res.lines) == count
    assert r.returncode == 0, r.stderr_text
    got = _lines(r.stdout_text, "server ping data: ")
    assert len(got) == count
    assert got[-1] == "server ping data: " + ping_text(count - 1, size)[:-1].decode()
    # the kernel's REP: what an rdma_cm passive side answers (roce-wire.md 3.4)
    rep = conn.rep
    assert (rep["target_ack_delay"], rep["rnr_retry_count"]) == (15, 7)
    assert (rep["responder_resources"], rep["initiator_depth"]) == (1, 1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("size", "count"), [(64, 3), (65535, 5)])
def test_guest_rping_client_against_raw_cm_rping_server(
    ibal_lab_module_net: LabSession, size: int, count: int
) -> None:
    """The unmodified ``rping -c -V`` against ibal's rping server (CM by hand)."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, guest_ip = _addrs(s)
    with host_stack(s) as (_, pd, ca_guid, port_guid):
        end = RpingEndpoint(pd, size, client=False)
        end.init(1)
        end.post_recv()
        raw = RawCm(pd, port_guid)
        client = s.guest_start(["rping", "-c", "-a", host_ip, "-S", str(size), "-C", str(count),
                                "-v", "-V"], timeout=240)  # fmt: skip
        try:
            conn, hdr = raw_accept(raw, end.qp, ca_guid, 1, 0, RPING_PORT, random.Random(size))
            res = end.run(end.server_machine(verbose=True), closed=conn.dreq_arrived,
                          out=lambda _: None)  # fmt: skip
            r = client.wait()
        finally:
            if not client.done():
                client.kill()
    assert (str(hdr.src), str(hdr.dst)) == (guest_ip, host_ip)
    assert r.returncode == 0, r.stderr_text
    assert res.pings == count
    got = _lines(r.stdout_text, "ping data: ")
    assert len(got) == count and got[0] == "ping data: " + ping_text(0, size)[:-1].decode()


# ------------------------------------------------ `ibal rping` (ibal.cm.rdma) against rping

REPO = Path(__file__).resolve().parents[2]


def _ibal_rping(s: LabSession, *args: str, dev: str | None = None) -> list[str]:
    host_ip, _ = _addrs(s)
    return [sys.executable, "-m", "ibal.cli", "rping", "--provider", "rxe",
            "-o", f"devices=rxe0={dev or host_ip}", *args]  # fmt: skip


V6_HOST, V6_GUEST = "fd99::1", "fd99::2"  # unique local addresses, inside the lab's namespace


def _link_addrs(s: LabSession, family: int) -> tuple[str, str, str]:
    """Host address, guest address and ibal's rxe device (``devices=`` value) of the lab
    link for IP version ``family``.  IPv6: ULAs added once per guest (``nodad``: usable at
    once), and the guest's rxe0 has the GID before this returns."""
    host_ip, guest_ip = _addrs(s)
    if family == 4:
        return host_ip, guest_ip, host_ip
    cfg = s.net_config
    assert cfg is not None
    if V6_GUEST not in s.run(["ip", "-6", "addr", "show", "dev", "eth0"], timeout=30).stdout_text:
        s.run(["ip", "-6", "addr", "add", f"{V6_GUEST}/64", "dev", "eth0", "nodad"], timeout=30)
    r = s.host_run(["ip", "-6", "addr", "replace", f"{V6_HOST}/64", "dev", cfg.tap, "nodad"],
                   timeout=30, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    gid = ipaddress.IPv6Address(V6_GUEST).exploded
    until("the guest's rxe0 GID for " + V6_GUEST, lambda: gid in s.run(
        ["sh", "-c", "cat /sys/class/infiniband/rxe0/ports/1/gids/*"], timeout=30
    ).stdout_text, 30)  # fmt: skip
    return V6_HOST, V6_GUEST, cfg.tap


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("size", "count", "family"), [(64, 1, 4), (65535, 100, 4), (65535, 20, 6)])
def test_ibal_rping_client_against_guest_rping_server(
    ibal_lab_module_net: LabSession, size: int, count: int, family: int
) -> None:
    """The unmodified rping server over kernel rdma_cm and kernel rxe; over IPv6 too (the
    guest's server listens on its IPv6 address only, so the REQ and the data go by it)."""
    lab_requires("net", "rdmacm")
    if os.geteuid() != 0:
        pytest.skip("the rxe provider's raw sockets need root")
    s = ibal_lab_module_net
    _, guest_ip, dev = _link_addrs(s, family)
    server = s.guest_start(["rping", "-s", "-a", guest_ip, "-S", str(size), "-v"], timeout=240)
    try:
        deadline = time.monotonic() + 60
        while True:  # bounded: rejected while the guest's rping is not listening yet
            cli = s.host_run(_ibal_rping(s, "-c", "-a", guest_ip, "-S", str(size), "-C",
                                         str(count), "-v", "-V", dev=dev),
                             timeout=240, text=True, cwd=REPO)  # fmt: skip
            if cli.returncode == 0 or "rejected" not in cli.stderr:
                break
            assert time.monotonic() < deadline and not server.done(), cli.stderr
            time.sleep(0.5)
        r = server.wait()
    finally:
        if not server.done():
            server.kill()
    assert cli.returncode == 0, cli.stderr
    got = _lines(cli.stdout, "ping data: ")
    assert len(got) == count and got[-1] == "ping data: " + ping_text(count - 1, size)[:-1].decode()
    assert r.returncode == 0, r.stderr_text
    assert len(_lines(r.stdout_text, "server ping data: ")) == count
    assert "server DISCONNECT EVENT" in r.stderr_text


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("size", "count", "family"), [(64, 1, 4), (65535, 100, 4), (65535, 20, 6)])
def test_guest_rping_client_against_ibal_rping_server(
    ibal_lab_module_net: LabSession, size: int, count: int, family: int
) -> None:
    lab_requires("net", "rdmacm")
    if os.geteuid() != 0:
        pytest.skip("the rxe provider's raw sockets need root")
    s = ibal_lab_module_net
    host_ip, _, dev = _link_addrs(s, family)
    out_file = s.host_dir / f"ibal-rping-{size}-{count}-v{family}.out"  # -v prints MBs
    with out_file.open("w") as sink:
        srv = s.host_popen(_ibal_rping(s, "-s", "-a", host_ip, "-S", str(size), "-v", dev=dev),
                           stdout=sink, stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # bounded: REJ (nobody listening) while ibal's server starts
            r = s.run(["rping", "-c", "-a", host_ip, "-S", str(size), "-C", str(count), "-v",
                       "-V"], timeout=240)  # fmt: skip
            if r.returncode == 0 or "REJECTED" not in r.stderr_text:
                break
            assert time.monotonic() < deadline and srv.poll() is None, r.stderr_text
            time.sleep(0.5)
        _, err = srv.communicate(timeout=60)
        out = out_file.read_text()
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    assert r.returncode == 0, r.stderr_text
    got = _lines(r.stdout_text, "ping data: ")
    assert len(got) == count and got[0] == "ping data: " + ping_text(0, size)[:-1].decode()
    assert srv.returncode == 0, err
    assert len(_lines(out, "server ping data: ")) == count
    assert "server DISCONNECT EVENT" in err


@pytest.mark.timeout(300)
def test_guest_rping_clients_at_once_against_ibal_persistent_server(
    ibal_lab_module_net: LabSession,
) -> None:
    """``ibal rping -s -P``: an unmodified rping client in the guest, then two at once, on
    one listen; SIGTERM ends the server, after the clients, with status 0."""
    lab_requires("net", "rdmacm")
    if os.geteuid() != 0:
        pytest.skip("the rxe provider's raw sockets need root")
    s = ibal_lab_module_net
    host_ip, _ = _addrs(s)
    out_file = s.host_dir / "ibal-rping-persistent.out"
    with out_file.open("w") as sink:
        srv = s.host_popen(_ibal_rping(s, "-s", "-P", "-a", host_ip, "-S", "1000", "-v"),
                           stdout=sink, stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    client = ["rping", "-c", "-a", host_ip, "-S", "1000", "-V", "-C"]
    try:
        deadline = time.monotonic() + 60
        while True:  # bounded: REJ (nobody listening) while ibal's server starts
            r = s.run([*client, "1"], timeout=120)
            if r.returncode == 0 or "REJECTED" not in r.stderr_text:
                break
            assert time.monotonic() < deadline and srv.poll() is None, r.stderr_text
            time.sleep(0.5)
        assert r.returncode == 0, r.stderr_text
        jobs = [s.guest_start([*client, str(n)], timeout=240) for n in (30, 40)]
        results = [j.wait() for j in jobs]
        assert [x.returncode for x in results] == [0, 0], [x.stderr_text for x in results]
        assert srv.poll() is None  # still serving
        srv.terminate()
        _, err = srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    assert srv.returncode == 0, err
    assert len(_lines(out_file.read_text(), "server ping data: ")) == 1 + 30 + 40
    assert err.count("server DISCONNECT EVENT") == 3, err


# ------------------------------------------------ cmtime: many connections at once

CMTIME_PORT = 7471


def cmtime_steps(text: str) -> dict[str, float]:
    """cmtime's table (``"%-13s: %11.2f%11.2f%11.2f%11.2f"``: wide numbers touch): each
    step's total in ms."""
    out = {}
    for line in text.splitlines():
        if len(line) >= 26 and line[13:15] == ": ":
            out[line[:13].strip()] = float(line[15:26])
    return out


def wait_listening(s: LabSession, job: GuestJob, port: int) -> None:
    """Until the guest's rdma_cm has a listener on ``port`` (``rdma res show cm_id``)."""
    deadline = time.monotonic() + 60
    while True:  # bounded poll: the guest's tool is starting
        r = s.run(["rdma", "res", "show", "cm_id"], timeout=30)
        if any("state LISTEN" in line and f":{port} " in line
               for line in r.stdout_text.splitlines()):  # fmt: skip
            return
        assert time.monotonic() < deadline and not job.done(), r.stdout_text
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_guest_cmtime_against_ibal_server(ibal_lab_module_net: LabSession) -> None:
    """The unmodified ``cmtime -c 20`` connects and disconnects 20 RC QPs with ibal's CM."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, _ = _addrs(s)
    with host_stack(s) as (al, _, _, _), CmtimeServer(al, CMTIME_PORT, addr=host_ip) as srv:
        r = s.run(["cmtime", "-s", host_ip, "-c", "20"], timeout=240)
        assert srv.wait(lambda x: x.disconnected >= 20, 60), (srv.answered, srv.disconnected)
        assert (srv.answered, srv.failures()) == (20, 0)
    assert r.returncode == 0, r.stderr_text + r.stdout_text
    steps = cmtime_steps(r.stdout_text)
    assert steps["connect"] > 0 and steps["disconnect"] > 0, r.stdout_text
    assert "RDMA_CM_EVENT" not in r.stdout_text and "event:" not in r.stdout_text


@pytest.mark.timeout(300)
def test_ibal_cmtime_against_guest_server(ibal_lab_module_net: LabSession) -> None:
    """ibal's cmtime client: 20 connections to the unmodified ``cmtime`` server and back."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    server = s.guest_start(["cmtime", "-b", guest_ip], timeout=240)
    try:
        # Not a probe connection: cmtime 44's server REJects every request after its
        # first disconnect ("failure creating qp": its global QP init attribute keeps
        # the CQs rdma_create_qp made for a connection now gone); ask the kernel.
        wait_listening(s, server, CMTIME_PORT)
        with host_stack(s) as (al, _, _, _):
            lines: list[str] = []
            res = run_client(al, CmtimeOptions(server=guest_ip, connections=20),
                             out=lines.append)  # fmt: skip
    finally:
        server.kill()
        server.wait()
    assert res.failed == 0, [line for line in lines if "failed" in line]
    assert len(res.each["connect"]) == len(res.each["disconnect"]) == 20
    assert cmtime_steps("\n".join(lines))["connect"] == pytest.approx(res.total["connect"] * 1e3,
                                                                     abs=0.01)  # fmt: skip


# ------------------------------------------------ udaddy: the UDP port space (SIDR)

UD_MSGS, UD_SIZE = 10, 100  # udaddy's defaults (-C, -S)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("peers", [1, 2])
def test_guest_udaddy_client_against_ibal_udaddy_server(ibal_lab_module_net: LabSession,
                                                        peers: int) -> None:  # fmt: skip
    """udaddy's SIDR_REQs (UDP port space, CMA header) answered by ``ibal udaddy``'s server
    (in process); 10 datagrams of 100 bytes each way per peer."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, _ = _addrs(s)
    with host_stack(s) as (al, _, _, _):
        srv = ServerThread(lambda listening: udaddy(
            al, UdaddyOptions(bind=host_ip, connections=peers), out=lambda _: None,
            listening=listening))  # fmt: skip
        srv.wait_listening(60)
        r = s.run(["udaddy", "-s", host_ip, "-c", str(peers)], timeout=120)
        server = srv.result(120)
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "data transfers complete" in r.stdout_text and "return status 0" in r.stdout_text
    got = server.received
    assert len(got) == peers and all(len(x) == UD_MSGS for x in got)
    assert all(len(m) == UD_SIZE for x in got for m in x)  # udaddy's 100 bytes, no GRH


@pytest.mark.timeout(300)
@pytest.mark.parametrize("peers", [1, 2])
def test_ibal_udaddy_client_against_guest_udaddy_server(ibal_lab_module_net: LabSession,
                                                        peers: int) -> None:  # fmt: skip
    """``ibal udaddy``'s SIDR_REQs with the CMA header resolve udaddy's UD QPs; 10
    datagrams each way per peer, udaddy's server replying to the QPN in our immediate."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    server = s.guest_start(["udaddy", "-b", guest_ip, "-c", str(peers)], timeout=120)
    try:
        with host_stack(s) as (al, _, _, _):
            deadline = time.monotonic() + 60
            while True:  # bounded: SIDR_REP "unsupported" while udaddy is not listening yet
                try:
                    res = udaddy(al, UdaddyOptions(server=guest_ip, connections=peers,
                                                   timeout=30), out=lambda _: None)
                    break
                except UdaddyError as exc:  # or no answer while ib_cm loads
                    assert time.monotonic() < deadline and not server.done(), exc
                    time.sleep(0.5)
        r = server.wait()
    finally:
        if not server.done():
            server.kill()
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "data transfers complete" in r.stdout_text
    assert len(res.received) == peers and all(len(x) == UD_MSGS for x in res.received)


# ------------------------------------------------ ucmatose: connections with messages

CMATOSE_PORT = 7481  # not cmtime's 7471: the module's cmtime servers may linger


@pytest.mark.timeout(300)
def test_ibal_ucmatose_client_against_guest_ucmatose_server(
    ibal_lab_module_net: LabSession,
) -> None:
    """The guest's ``ucmatose`` server sends 10 messages on each of 2 connections, ``ibal
    ucmatose`` sends 10 back on each, the server disconnects; both report success."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    server = s.guest_start(["ucmatose", "-b", guest_ip, "-p", str(CMATOSE_PORT), "-c", "2"],
                           timeout=120)  # fmt: skip
    try:
        wait_listening(s, server, CMATOSE_PORT)
        with host_stack(s) as (al, _, _, _):
            lines: list[str] = []
            res = cmatose(al, CmatoseOptions(server=guest_ip, port=CMATOSE_PORT,
                                             connections=2, timeout=60), out=lines.append)
        r = server.wait()
    finally:
        if not server.done():
            server.kill()
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "data transfers complete" in r.stdout_text and "disconnected" in r.stdout_text
    assert [len(x) for x in res.received] == [10, 10] and "return status 0" in lines


@pytest.mark.timeout(300)
def test_guest_ucmatose_client_against_ibal_ucmatose_server(
    ibal_lab_module_net: LabSession,
) -> None:
    """``ibal ucmatose``'s server accepts the guest client's 2 connections, sends 10
    messages of 100 bytes on each, takes 10 back and disconnects."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, _ = _addrs(s)
    with host_stack(s) as (al, _, _, _):
        srv = ServerThread(lambda listening: cmatose(
            al, CmatoseOptions(bind=host_ip, port=CMATOSE_PORT, connections=2, timeout=60),
            out=lambda _: None, listening=listening))  # fmt: skip
        srv.wait_listening(60)
        r = s.run(["ucmatose", "-s", host_ip, "-p", str(CMATOSE_PORT), "-c", "2"],
                  timeout=120)  # fmt: skip
        got = srv.result(120).received
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "data transfers complete" in r.stdout_text and "return status 0" in r.stdout_text
    assert [len(x) for x in got] == [10, 10] and all(len(m) == 100 for x in got for m in x)


# ------------------------------------------------ mckey: rdma_cm multicast on RoCE

MC_GROUP = "239.1.2.3"


def _guest_mcast_route(s: LabSession) -> None:
    """The guest has no default route: multicast leaves by eth0 (as a LAN's route would)."""
    s.run(["ip", "route", "replace", "224.0.0.0/4", "dev", "eth0"], timeout=30)


@pytest.mark.timeout(300)
def test_ibal_mckey_sender_to_guest_mckey_receiver(ibal_lab_module_net: LabSession) -> None:
    """The guest's mckey joins the group with kernel rdma_cm (GID ::ffff:239.1.2.3, an
    IGMP join on eth0); ``ibal mckey -s`` sends 10 datagrams to it; the guest takes all."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, guest_ip = _addrs(s)
    _guest_mcast_route(s)
    receiver = s.guest_start(["mckey", "-m", MC_GROUP, "-b", guest_ip], timeout=120)
    try:
        until("the guest's mckey in the group", lambda: "239.1.2.3" in s.run(
            ["ip", "maddr", "show", "dev", "eth0"], timeout=30).stdout_text, 60)  # fmt: skip
        with host_stack(s) as (al, _, _, _):
            lines: list[str] = []
            sent = mckey(al, MckeyOptions(group=MC_GROUP, sender=True, bind=host_ip,
                                                 delay=0, timeout=30), out=lines.append)
        r = receiver.wait()
    finally:
        if not receiver.done():
            receiver.kill()
    assert sent.received == [[]] and "data transfers complete" in lines
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "mckey: joined dgid: ::ffff:239.1.2.3" in r.stdout_text
    assert "data transfers complete" in r.stdout_text and "return status 0" in r.stdout_text


@pytest.mark.timeout(300)
def test_guest_mckey_sender_to_ibal_mckey_receiver(ibal_lab_module_net: LabSession) -> None:
    """``ibal mckey`` (two nodes) joins the group; the guest's ``mckey -s`` sends 10
    datagrams of 100 bytes to it through kernel rxe; each ibal node takes all 10."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, guest_ip = _addrs(s)
    _guest_mcast_route(s)
    with host_stack(s) as (al, _, _, _):
        srv = ServerThread(lambda joined: mckey(
            al, MckeyOptions(group=MC_GROUP, bind=host_ip, connections=2, timeout=60),
            out=lambda _: None, joined=joined))  # fmt: skip
        srv.wait_listening(60)
        r = s.run(["mckey", "-m", MC_GROUP, "-s", "-b", guest_ip], timeout=120)
        got = srv.result(120).received
    assert r.returncode == 0, r.stdout_text + r.stderr_text
    assert "data transfers complete" in r.stdout_text
    assert [len(x) for x in got] == [UD_MSGS, UD_MSGS]
    assert all(len(m) == UD_SIZE for x in got for m in x)


# ------------------------------------------------ faults on the link: netem in the guest

NETEM = "loss 20% duplicate 10% delay 50ms"
NETEM_CONNS = 10  # a lost kernel REQ or DREQ waits ~6 s for its retry: the run is the tail
FAULT_PORT = 7472  # nobody listens there: every REQ is refused


@contextlib.contextmanager
def guest_netem(s: LabSession, spec: str) -> Iterator[None]:
    """``netem`` on the guest's eth0 egress and, through an ifb device, its ingress: every
    frame of the link meets it once each way (the host kernel here has no sch_netem)."""
    setup = (
        "modprobe sch_netem; modprobe ifb numifbs=1; modprobe act_mirred; modprobe cls_matchall;"
        " ip link show ifb0 >/dev/null 2>&1 || ip link add ifb0 type ifb;"
        " ip link set ifb0 up &&"
        f" tc qdisc replace dev eth0 root netem {spec} &&"
        " tc qdisc replace dev eth0 handle ffff: ingress &&"
        " tc filter replace dev eth0 parent ffff: matchall"
        " action mirred egress redirect dev ifb0 &&"
        f" tc qdisc replace dev ifb0 root netem {spec}"
    )
    r = s.run(setup, timeout=60)
    if r.returncode != 0:
        pytest.fail(f"netem in the guest: {r.stderr_text}{r.stdout_text}", pytrace=False)
    try:
        yield
    finally:
        s.run("tc qdisc del dev eth0 root; tc qdisc del dev eth0 ingress;"
              " tc qdisc del dev ifb0 root", timeout=60)  # fmt: skip


def guest_cm_ids(s: LabSession, port: int) -> list[str]:
    """The guest's rdma_cm ids on ``port`` other than its listener."""
    r = s.run(["rdma", "res", "show", "cm_id"], timeout=30)
    return [line for line in r.stdout_text.splitlines()
            if f":{port} " in line and "state LISTEN" not in line]  # fmt: skip


def guest_rc_qps(s: LabSession) -> list[str]:
    r = s.run(["rdma", "res", "show", "qp"], timeout=30)
    return [line for line in r.stdout_text.splitlines() if " type RC " in line]


def until(what: str, check: Callable[[], object], seconds: float) -> None:
    """Bounded poll of state the other side frees in its own time (kernel, timewait)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} after {seconds} s"
        time.sleep(0.2)


def ibal_left(al: AccessLayer) -> tuple[int, int]:
    agent = agent_of(al.manager)
    return agent.endpoints, agent.armed_timers()


@pytest.mark.timeout(300)
def test_netem_ibal_cmtime_against_guest_server(ibal_lab_module_net: LabSession) -> None:
    """Under netem both ways, ibal's 10 connections to the guest's ``cmtime`` server are
    established and disconnected (lost MADs resent, duplicates answered), and afterwards
    neither side keeps an endpoint, timer, cm_id or RC QP."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    server = s.guest_start(["cmtime", "-b", guest_ip], timeout=240)
    try:
        wait_listening(s, server, CMTIME_PORT)
        with guest_netem(s, NETEM), host_stack(s) as (al, _, _, _):
            lines: list[str] = []
            res = run_client(al, CmtimeOptions(server=guest_ip, connections=NETEM_CONNS),
                             out=lines.append)  # fmt: skip
            until("ibal's endpoints and timers", lambda: ibal_left(al) == (0, 0), 30)
        assert res.failed == 0, [line for line in lines if "failed" in line]
        assert len(res.each["connect"]) == len(res.each["disconnect"]) == NETEM_CONNS
        until("the guest server's connection ids", lambda: guest_cm_ids(s, CMTIME_PORT) == [],
              30)  # fmt: skip
    finally:
        server.kill()
        server.wait()
    until("the guest's RC QPs", lambda: guest_rc_qps(s) == [], 30)


@pytest.mark.timeout(300)
def test_netem_guest_cmtime_against_ibal_server(ibal_lab_module_net: LabSession) -> None:
    """Under netem both ways, the guest's ``cmtime -c 10`` against ibal's server: every
    connection ends disconnected, nothing left on either side.  One whose RTU is lost
    meets the client's DREQ first (cmtime disconnects at once): the DREQ stands for the
    RTU and ends it, "disconnected before it was established", as in rdma_cm (a
    DISCONNECTED event with no ESTABLISHED before); every other one is established."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    host_ip, _ = _addrs(s)
    with host_stack(s) as (al, _, _, _):
        with CmtimeServer(al, CMTIME_PORT, addr=host_ip) as srv, guest_netem(s, NETEM):
            r = s.run(["cmtime", "-s", host_ip, "-c", str(NETEM_CONNS)], timeout=240)
            assert srv.wait(lambda x: x.disconnected >= NETEM_CONNS, 60), (srv.answered,
                                                                           srv.disconnected)
            errors = [c.connection.error for c in srv.connections]
            assert srv.answered == NETEM_CONNS and srv.refused == 0
            assert all(e is None or isinstance(e, InvalidState) for e in errors), errors
        until("ibal's endpoints and timers", lambda: ibal_left(al) == (0, 0), 30)
    assert r.returncode == 0, r.stderr_text + r.stdout_text
    assert cmtime_steps(r.stdout_text)["disconnect"] > 0, r.stdout_text
    assert guest_cm_ids(s, CMTIME_PORT) == [] and guest_rc_qps(s) == []


@pytest.mark.timeout(300)
def test_netem_refused_and_unanswered_requests_fail_with_the_right_callback(
        ibal_lab_module_net: LabSession) -> None:  # fmt: skip
    """Under netem, 10 REQs to a port nobody listens on each end in the guest kernel's REJ
    (invalid service ID; a lost REJ is met again by the resent REQ); with every frame
    lost, a REQ of 3 short tries ends in ``Timeout``.  No hang, nothing left."""
    lab_requires("net", "rdmacm")
    s = ibal_lab_module_net
    _, guest_ip = _addrs(s)
    with host_stack(s) as (al, pd, _, _):
        cq = pd.ca.create_cq(64)
        route = resolve_route(al, guest_ip)
        outcome: list[BaseException | None] = []
        done = threading.Event()

        def finished(c: rdma.RdmaConnection) -> None:  # misc queue
            outcome.append(c.connection.error)
            if len(outcome) == 10:
                done.set()

        qps = [pd.create_qp(QpCreate(QpType.RC, cq, cq)) for _ in range(11)]
        with guest_netem(s, NETEM):
            for qp in qps[:10]:
                rdma.connect(al, guest_ip, FAULT_PORT, qp, route=route, callback=finished,
                             remote_resp_timeout=16)  # a lost REJ: the REQ again in ~0.8 s
            assert done.wait(120), outcome
        assert all(isinstance(e, ConnectionRejected) and e.reason == RejReason.INVALID_SERVICE_ID
                   for e in outcome), outcome  # fmt: skip
        with guest_netem(s, "loss 100%"), pytest.raises(Timeout):
            rdma.connect(al, guest_ip, FAULT_PORT, qps[10], route=route, timeout=60,
                         remote_resp_timeout=16, max_cm_retries=2)  # fmt: skip
        until("ibal's endpoints and timers", lambda: ibal_left(al) == (0, 0), 30)
        for qp in qps:
            qp.destroy()
        cq.destroy()
    assert guest_cm_ids(s, FAULT_PORT) == []
