"""Regenerate tests/data/rxe-golden/: RoCEv2 frames kernel rxe sends, one per opcode.

Run as root from the repository root (needs the lab: qemu, a kernel with
rdma_rxe, pyverbs; see docs/lab.md):

    python3 tests/data/make_rxe_golden.py [--naks] [OUT.pcap]

It boots the lab with ``--net``, opens a raw packet socket on the tap in the
lab's namespace, has the guest's kernel rxe send every request opcode
(``rxe_golden_guest.py``) to a QP number nobody owns on the host address, and
keeps the first frame of each opcode, as captured (Ethernet, IPv4 with the
kernel's IP ID, UDP, BTH..., ICRC), in opcode order.  Nothing answers, so the
requests go out once each (retries come seconds later and are ignored).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from ibal.lab import Lab, LabSession  # noqa: E402
from ibal.providers.rxe import wire  # noqa: E402
from ibal.wire.packet import HDR_LEN, ICRC_LEN, Opcode, Packet  # noqa: E402
from ibal.wire.pcap import LINKTYPE_ETHERNET, PcapWriter  # noqa: E402

OUT = HERE / "rxe-golden" / "kernel-rxe-requests.pcap"  # and ...-responses.pcap
FAKE_QPN = 0x000ABC
ETH_P_ALL = 0x0003
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2

# What the guest script makes kernel rxe send (responses need a requester on
# the host side, which the ibal rxe provider will be).
WANTED: tuple[Opcode, ...] = tuple(
    op for op in Opcode
    if op.name.startswith(("RC_", "UC_", "UD_"))
    and not op.name.startswith(("RC_RDMA_READ_RESPONSE", "RC_ACKNOWLEDGE", "RC_ATOMIC_ACK"))
)  # fmt: skip


def capture(session: LabSession, timeout: float = 240.0) -> dict[Opcode, tuple[float, bytes]]:
    """First frame of every wanted opcode the guest's kernel rxe sends to the tap."""
    cfg = session.net_config
    assert cfg is not None
    with session.in_netns():
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        raw.bind((cfg.tap, 0))
    raw.settimeout(1.0)
    guest = session.guest_start(
        ["/usr/bin/python3", str(HERE / "rxe_golden_guest.py"), cfg.host_ip, hex(FAKE_QPN)],
        timeout=timeout,
    )
    found: dict[Opcode, tuple[float, bytes]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < len(WANTED) and time.monotonic() < deadline:
            if guest.done() and not found:
                break
            try:
                frame = raw.recv(65535)
            except TimeoutError:
                continue
            f = wire.split_ethernet(frame)
            if f is None or len(f.udp_payload) < 1:
                continue
            op = f.udp_payload[0]
            if op in Opcode.__members__.values() and Opcode(op) not in found:
                found[Opcode(op)] = (time.time(), frame)
    finally:
        raw.close()
        if not guest.done():
            guest.kill()
        result = guest.wait()
    if len(found) < len(WANTED):
        missing = [op.name for op in WANTED if op not in found]
        raise RuntimeError(
            f"kernel rxe did not send {missing}; guest said: {result.stdout_text}"
            f"{result.stderr_text}"
        )
    return found


HOST_QPN = 0x000DEF
RQ_PSN = 0x000100
RESPONSES: tuple[Opcode, ...] = (
    Opcode.RC_RDMA_READ_RESPONSE_FIRST, Opcode.RC_RDMA_READ_RESPONSE_MIDDLE,
    Opcode.RC_RDMA_READ_RESPONSE_LAST, Opcode.RC_RDMA_READ_RESPONSE_ONLY,
    Opcode.RC_ACKNOWLEDGE, Opcode.RC_ATOMIC_ACKNOWLEDGE,
)  # fmt: skip
SEND_DATA = bytes(range(0x40, 0x50))
WRITE_DATA = bytes(range(0x80, 0x90))


def host_requests(qpn: int, rkey: int, addr: int) -> list[Packet]:
    """What the host sends the guest's responder QP, PSN by PSN."""
    psn = RQ_PSN
    reqs = []

    def req(op: Opcode, payload: bytes = b"") -> Packet:
        nonlocal psn
        p = Packet(op, qpn, psn, payload, ack_req=True)
        reqs.append(p)
        return p

    req(Opcode.RC_SEND_ONLY, SEND_DATA)
    psn += 1
    w = req(Opcode.RC_RDMA_WRITE_ONLY, WRITE_DATA)
    w.va, w.rkey, w.dma_len = addr + 2048, rkey, len(WRITE_DATA)
    psn += 1
    r = req(Opcode.RC_RDMA_READ_REQUEST)
    r.va, r.rkey, r.dma_len = addr, rkey, 600  # 3 responses at MTU 256
    psn += 3
    r = req(Opcode.RC_RDMA_READ_REQUEST)
    r.va, r.rkey, r.dma_len = addr + 256, rkey, 16
    psn += 1
    a = req(Opcode.RC_FETCH_ADD)
    a.va, a.rkey, a.swap_add = addr + 1024, rkey, 0x0101010101010101
    return reqs


def capture_responses(
    session: LabSession, timeout: float = 120.0
) -> tuple[dict[Opcode, tuple[float, bytes]], list[bytes], str]:
    """Requests from ibal's encoder to a kernel-rxe RC QP; its responses, our frames as
    they left (IP ID and all), and what the guest saw land in its memory."""
    cfg = session.net_config
    assert cfg is not None
    info = session.host_dir / "responder.txt"
    guest = session.guest_start(
        ["/usr/bin/python3", str(HERE / "rxe_golden_responder.py"), cfg.host_ip,
         hex(HOST_QPN), hex(RQ_PSN), session.guest_path(info)],
        timeout=timeout,
    )  # fmt: skip
    with session.in_netns():
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        raw.bind((cfg.tap, 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)  # DF, so IP ID 0
    raw.settimeout(1.0)
    found: dict[Opcode, tuple[float, bytes]] = {}
    ours: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while not info.exists():
            if guest.done() or time.monotonic() > deadline:
                r = guest.wait()
                raise RuntimeError(f"responder did not start: {r.stdout_text}{r.stderr_text}")
            time.sleep(0.2)
        qpn, rkey, addr = (int(x) for x in info.read_text().split())
        src, dst = socket.inet_aton(cfg.host_ip), socket.inet_aton(cfg.guest_ip)
        with session.in_netns():  # the source port kernel rxe would pick for this pair
            udp.bind((cfg.host_ip, wire.connected_udp_sport(0, HOST_QPN, qpn)))
        for p in host_requests(qpn, rkey, addr):
            n = HDR_LEN[p.opcode] + len(p.payload) + (-len(p.payload) & 3) + ICRC_LEN
            prefix = wire.icrc_prefix_ipv4(src, dst, n, udp.getsockname()[1])
            udp.sendto(wire.encode_bytes(p, prefix), (cfg.guest_ip, wire.ROCE_V2_PORT))
        while len(found) < len(RESPONSES) and time.monotonic() < deadline:
            try:
                frame = raw.recv(65535)
            except TimeoutError:
                continue
            f = wire.split_ethernet(frame)
            if f is None or not f.udp_payload:
                continue
            if f.src == src:
                ours.append(frame)
                continue
            op = Opcode(f.udp_payload[0])
            if op in RESPONSES and op not in found:
                found[op] = (time.time(), frame)
        (session.host_dir / "responder.txt.go").write_text("check")
        result = guest.wait()
    finally:
        raw.close()
        udp.close()
        if not guest.done():
            guest.kill()
    return found, ours, result.stdout_text + result.stderr_text


# NAKs, RNR NAK and duplicate answers: requests from ibal's encoder to a fresh
# kernel-rxe responder QP (rxe_golden_responder.py: one 1024-byte receive posted,
# rq_psn RQ_PSN, min_rnr_timer 12, MTU 256).  Each step's note says what it
# provokes; the access error and the invalid request each move the guest's QP to
# ERROR, so they run on two responder QPs (two guest runs).
NAKS_OUT = HERE / "rxe-golden" / "kernel-rxe-naks.pcap"  # and ...-naks.json
BAD_RKEY_XOR = 0x00FF0000  # the guest's rkey with its index bits changed


def nak_steps(run: int, qpn: int, rkey: int, addr: int) -> list[tuple[str, Packet]]:
    """The requests of responder run 0 or 1, each with what it should provoke."""
    def pkt(op: Opcode, psn: int, payload: bytes = b"") -> Packet:
        return Packet(op, qpn, psn, payload, ack_req=True)

    if run == 1:
        mid = pkt(Opcode.RC_SEND_MIDDLE, RQ_PSN, bytes(256))
        mid.ack_req = False
        return [("SEND MIDDLE with no FIRST: invalid request NAK", mid)]
    fa = pkt(Opcode.RC_FETCH_ADD, RQ_PSN + 1)
    fa.va, fa.rkey, fa.swap_add = addr + 1024, rkey, 0x0101010101010101
    bad = pkt(Opcode.RC_RDMA_WRITE_ONLY, RQ_PSN + 2, WRITE_DATA)
    bad.va, bad.rkey, bad.dma_len = addr + 2048, rkey ^ BAD_RKEY_XOR, len(WRITE_DATA)
    return [
        ("SEND ONLY, receive posted: ACK", pkt(Opcode.RC_SEND_ONLY, RQ_PSN, SEND_DATA)),
        ("FETCH_ADD: atomic ACK", fa),
        ("SEND ONLY, no receive left: RNR NAK",
         pkt(Opcode.RC_SEND_ONLY, RQ_PSN + 2, SEND_DATA)),
        ("SEND ONLY 4 PSNs ahead: PSN sequence error NAK",
         pkt(Opcode.RC_SEND_ONLY, RQ_PSN + 6, SEND_DATA)),
        ("the FETCH_ADD again: duplicate, the saved atomic ACK", fa),
        ("the first SEND again: duplicate, ACK", pkt(Opcode.RC_SEND_ONLY, RQ_PSN, SEND_DATA)),
        ("WRITE with a bad R_Key: remote access error NAK", bad),
    ]  # fmt: skip


def exchange(
    session: LabSession, run: int, timeout: float = 120.0
) -> tuple[list[tuple[float, bytes]], dict[str, int], list[str], str]:
    """Run ``nak_steps(run)`` against a fresh kernel-rxe responder QP: every frame on
    the tap both ways in wire order, the guest QP's ``qpn``/``rkey``/``addr``, the
    notes of the requests sent, and what the guest printed."""
    cfg = session.net_config
    assert cfg is not None
    info = session.host_dir / f"naks{run}.txt"
    guest = session.guest_start(
        ["/usr/bin/python3", str(HERE / "rxe_golden_responder.py"), cfg.host_ip,
         hex(HOST_QPN), hex(RQ_PSN), session.guest_path(info)],
        timeout=timeout,
    )  # fmt: skip
    with session.in_netns():
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        raw.bind((cfg.tap, 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    raw.settimeout(0.5)
    seen: list[tuple[float, bytes]] = []
    try:
        deadline = time.monotonic() + timeout
        while not info.exists():
            if guest.done() or time.monotonic() > deadline:
                r = guest.wait()
                raise RuntimeError(f"responder did not start: {r.stdout_text}{r.stderr_text}")
            time.sleep(0.2)
        qpn, rkey, addr = (int(x) for x in info.read_text().split())
        src, dst = socket.inet_aton(cfg.host_ip), socket.inet_aton(cfg.guest_ip)
        with session.in_netns():
            udp.bind((cfg.host_ip, wire.connected_udp_sport(0, HOST_QPN, qpn)))
        steps = nak_steps(run, qpn, rkey, addr)
        answers = 0
        for _, p in steps:  # one at a time: each answer follows its request on the wire
            n = HDR_LEN[p.opcode] + len(p.payload) + (-len(p.payload) & 3) + ICRC_LEN
            prefix = wire.icrc_prefix_ipv4(src, dst, n, udp.getsockname()[1])
            udp.sendto(wire.encode_bytes(p, prefix), (cfg.guest_ip, wire.ROCE_V2_PORT))
            answers += 1
            quiet = time.monotonic() + 3.0  # the answer, or 3 s of nothing
            while time.monotonic() < min(quiet, deadline):
                try:
                    frame = raw.recv(65535)
                except TimeoutError:
                    continue
                f = wire.split_ethernet(frame)
                if f is None or not f.udp_payload or f.dport != wire.ROCE_V2_PORT:
                    continue
                seen.append((time.time(), frame if f.src != src else finish_checksums(frame)))
                if f.src != src and sum(1 for _, x in seen if _from_guest(x, src)) >= answers:
                    break
        (session.host_dir / f"naks{run}.txt.go").write_text("check")
        result = guest.wait()
    finally:
        raw.close()
        udp.close()
        if not guest.done():
            guest.kill()
    notes = [note for note, _ in steps]
    return seen, {"qpn": qpn, "rkey": rkey, "addr": addr}, notes, (
        result.stdout_text + result.stderr_text)


def finish_checksums(frame: bytes) -> bytes:
    """An outgoing IPv4 frame as it left once the NIC's checksum offload was done: the
    tap shows it before (IP checksum 0, UDP's partial).  UDP checksum 0 is legal on
    IPv4 and what rxe sends; the ICRC masks both fields."""
    b = bytearray(frame)
    b[24:26] = b"\0\0"
    b[24:26] = wire.ip_checksum(b[14:34]).to_bytes(2, "big")
    b[40:42] = b"\0\0"
    return bytes(b)


def _from_guest(frame: bytes, host: bytes) -> bool:
    f = wire.split_ethernet(frame)
    return f is not None and f.src != host


def capture_naks(session: LabSession) -> tuple[list[tuple[float, bytes]], dict[str, object]]:
    """Both responder runs: the frames, and a manifest describing them."""
    frames: list[tuple[float, bytes]] = []
    runs = []
    for run in (0, 1):
        seen, qp, notes, said = exchange(session, run)
        runs.append({**qp, "first_frame": len(frames), "frames": len(seen), "requests": notes,
                     "guest": said.strip().splitlines()})
        frames += seen
    manifest: dict[str, object] = {
        "what": "kernel rxe's ACK/NAK/RNR NAK answers to requests ibal encoded "
                "(tests/data/make_rxe_golden.py nak_steps), both directions in wire order",
        "host_qpn": HOST_QPN, "rq_psn": RQ_PSN, "min_rnr_timer": 12, "mtu": 256,
        "recv_len": 1024, "recv_offset": 3072, "runs": runs,
    }  # fmt: skip
    return frames, manifest


def write(found: dict[Opcode, tuple[float, bytes]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with PcapWriter(out, LINKTYPE_ETHERNET) as w:
        for op in sorted(found):
            ts, frame = found[op]
            w.write(frame, ts)


def write_all(frames: list[tuple[float, bytes]], out: Path) -> None:
    with PcapWriter(out, LINKTYPE_ETHERNET) as w:
        for ts, frame in frames:
            w.write(frame, ts)


def main(argv: list[str]) -> int:
    naks_only = "--naks" in argv  # only kernel-rxe-naks.{pcap,json}
    args = [a for a in argv[1:] if a != "--naks"]
    out = Path(args[0]) if args else OUT
    nout = out.with_name(out.name.replace("requests", "naks"))
    with Lab().session(net=True) as s:
        if not naks_only:
            found = capture(s)
            responses, _, guest_said = capture_responses(s)
        naks, manifest = capture_naks(s)
    if not naks_only:
        write(found, out)
        print(f"{len(found)} frames -> {out}")
        rout = out.with_name(out.name.replace("requests", "responses"))
        write(responses, rout)
        print(f"{len(responses)} frames -> {rout}; guest: {guest_said.strip()}")
    write_all(naks, nout)
    nout.with_suffix(".json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(naks)} frames -> {nout}")
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv))
