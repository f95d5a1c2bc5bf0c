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
import select
import socket
import struct
import time

import pytest

from ibal.cm import cma
from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.mad import cm
from ibal.mad.consts import CmAttr
from ibal.providers.rxe.wire import BTH, DETH
from ibal.types import Gid

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
