"""--net: the guest's eth0/rxe0 and host-side peers in the session's namespace.

One guest boot for the module (`ibal_lab_module_net`): every test closes its
sockets and ends its guest and host processes.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass

import pytest

from ibal.lab import GuestJob, LabSession
from ibal.lab.pytest_plugin import lab_requires

pytestmark = pytest.mark.lab

ROCE_PORT = 4791
PINGPONG_PORT = 18515


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError(f"peer closed after {len(data)} of {size} bytes")
        data += chunk
    return data


# Guest side: listen on TCP, announce the port over UDP, answer the UDP
# reply, then echo one TCP message upper-cased. UDP arriving at the host
# proves the listener is up, so the host needs no retry loop.
_GUEST_PEER = """
import socket, sys
host_ip, udp_port = sys.argv[1], int(sys.argv[2])
srv = socket.create_server(("0.0.0.0", 0))
srv.settimeout(60)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(60)
u.sendto(b"tcp %d" % srv.getsockname()[1], (host_ip, udp_port))
reply, addr = u.recvfrom(100)
print("udp", reply.decode(), addr[0])
conn, peer = srv.accept()
conn.sendall(conn.recv(100).upper())
print("tcp from", peer[0])
"""


def test_udp_and_tcp_between_namespace_and_guest(ibal_lab_module_net: LabSession) -> None:
    s = ibal_lab_module_net
    cfg = s.net_config
    assert cfg is not None
    with s.in_netns():
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((cfg.host_ip, 0))
    udp.settimeout(120)
    job = s.guest_start(
        ["/usr/bin/python3", "-c", _GUEST_PEER, cfg.host_ip, str(udp.getsockname()[1])], timeout=120
    )
    data, addr = udp.recvfrom(100)
    assert addr[0] == cfg.guest_ip
    tcp_port = int(data.split()[1])
    udp.sendto(b"pong", addr)
    with s.in_netns():
        tcp = socket.create_connection((cfg.guest_ip, tcp_port), timeout=60)
    with tcp:
        tcp.sendall(b"hello over tcp")
        assert _recv_exact(tcp, 14) == b"HELLO OVER TCP"
    r = job.wait()
    assert r.returncode == 0, r.stderr_text
    assert r.stdout_text.splitlines() == [f"udp pong {cfg.host_ip}", f"tcp from {cfg.host_ip}"]
    # The namespace is the guest's only link: the host's own network cannot see it.
    assert (
        s.host_run(["ip", "-br", "addr", "show", cfg.tap]).stdout.decode().split()[2]
        == cfg.host_address
    )


def _wire_gid(ip: str) -> str:
    """ibv_rc_pingpong's GID text: the 16 raw bytes of ::ffff:IP in hex."""
    return ipaddress.IPv6Address(f"::ffff:{ip}").packed.hex()


FAKE_QPN, FAKE_PSN = 0xABC, 0x123456
#: A 4096-byte SEND at MTU 1024 leaves as SEND First, Middle, Middle, Last.
SEND_OPCODES = [0, 1, 1, 2]


@dataclass
class PingpongClient:
    """The guest's ibv_rc_pingpong client, after it exchanged QP data with a fake peer."""

    job: GuestJob
    peer_ip: str
    lid: str
    qpn: int
    psn: int
    gid: str

    def stop(self) -> None:
        """The fake peer never ACKs and rxe (Debian 6.1) retransmits forever: kill it."""
        self.job.kill()
        r = self.job.wait(timeout=60)
        assert (r.returncode, r.timed_out) == (128 + 9, False)


def start_pingpong_against_fake_peer(s: LabSession) -> PingpongClient:
    """Run the guest's client against a TCP listener in the namespace that answers with a
    fabricated LID:QPN:PSN:GID; the client then sends RoCEv2 to the host side's UDP 4791."""
    cfg = s.net_config
    assert cfg is not None
    with s.in_netns():
        listener = socket.create_server((cfg.host_ip, PINGPONG_PORT))
    with listener:
        listener.settimeout(120)
        job = s.guest_start(
            ["ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "1", cfg.host_ip], timeout=120
        )
        conn, peer = listener.accept()
    with conn:
        conn.settimeout(60)
        lid, qpn, psn, gid = _recv_exact(conn, 52).rstrip(b"\0").decode().split(":")
        fake = f"0000:{FAKE_QPN:06x}:{FAKE_PSN:06x}:{_wire_gid(cfg.host_ip)}"
        conn.sendall(fake.encode() + b"\0")
        assert _recv_exact(conn, 5) == b"done\0"
    return PingpongClient(job, peer[0], lid, int(qpn, 16), int(psn, 16), gid)


def test_host_socket_in_namespace_receives_guest_roce(ibal_lab_module_net: LabSession) -> None:
    """What a userspace RoCE engine on the host side does: a UDP 4791 socket opened in the
    namespace receives the kernel rxe's packets; their BTH addresses the announced QP."""
    s = ibal_lab_module_net
    cfg = s.net_config
    assert cfg is not None
    with s.in_netns():
        roce = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        roce.bind((cfg.host_ip, ROCE_PORT))
    roce.settimeout(60)
    client = start_pingpong_against_fake_peer(s)
    assert client.peer_ip == cfg.guest_ip
    assert client.gid == _wire_gid(cfg.guest_ip)  # GID index 1: the IPv4-mapped address
    bths = []
    for _ in SEND_OPCODES:
        datagram, addr = roce.recvfrom(65536)
        assert addr[0] == cfg.guest_ip
        # BTH: opcode, flags, P_Key, reserved, dest QP (24 bits), A + reserved, PSN (24 bits)
        opcode, _flags, pkey, destqp, psn = struct.unpack_from(">BBHII", datagram)
        bths.append((opcode, pkey, destqp & 0xFFFFFF, psn & 0xFFFFFF))
        assert len(datagram) == 12 + 1024 + 4  # BTH + one MTU of the 4096 bytes + ICRC
    client.stop()
    roce.close()
    psns = [(client.psn + i) & 0xFFFFFF for i in range(len(SEND_OPCODES))]
    assert bths == [(op, 0xFFFF, FAKE_QPN, p) for op, p in zip(SEND_OPCODES, psns, strict=True)]


def test_guest_rxe_sends_rocev2_to_the_namespace(ibal_lab_module_net: LabSession) -> None:
    """The guest's ibv_rc_pingpong talks to a fake peer; tshark on the tap decodes its RoCEv2."""
    lab_requires("capture")
    s = ibal_lab_module_net
    cfg = s.net_config
    assert cfg is not None
    fields = ["ip.src", "ip.dst", "udp.dstport", "infiniband.bth.opcode",
              "infiniband.bth.destqp", "infiniband.bth.psn"]  # fmt: skip
    tshark = s.host_popen(
        ["tshark", "-n", "-l", "-i", cfg.tap, "-f", f"udp port {ROCE_PORT}",
         "-c", str(len(SEND_OPCODES)), "-a", "duration:120", "-T", "fields", "-E", "separator=,",
         *[a for f in fields for a in ("-e", f)]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    # Wait (bounded) until tshark says it captures, so no packet is missed.
    capturing = threading.Event()
    stderr_lines: list[bytes] = []

    def read_stderr() -> None:
        assert tshark.stderr is not None
        for line in tshark.stderr:
            stderr_lines.append(line)
            if b"Capturing on" in line:
                capturing.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    assert capturing.wait(60), b"".join(stderr_lines).decode(errors="replace")

    client = start_pingpong_against_fake_peer(s)
    out, _ = tshark.communicate(timeout=120)
    client.stop()
    rows = [line.split(",") for line in out.decode().splitlines() if line.strip()]
    assert len(rows) == len(SEND_OPCODES), out
    for i, (src, dst, port, opcode, destqp, psn) in enumerate(rows):
        assert (src, dst, int(port)) == (cfg.guest_ip, cfg.host_ip, ROCE_PORT)
        assert int(opcode, 0) == SEND_OPCODES[i]
        assert int(destqp, 0) == FAKE_QPN  # addressed to the QP our fake peer announced
        assert int(psn, 0) == (client.psn + i) & 0xFFFFFF  # from the PSN the client announced
