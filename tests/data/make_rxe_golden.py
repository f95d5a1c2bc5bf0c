"""Regenerate tests/data/rxe-golden/: RoCEv2 frames kernel rxe sends, one per opcode.

Run as root from the repository root (needs the lab: qemu, a kernel with
rdma_rxe, pyverbs; see docs/lab.md):

    python3 tests/data/make_rxe_golden.py [OUT.pcap]

It boots the lab with ``--net``, opens a raw packet socket on the tap in the
lab's namespace, has the guest's kernel rxe send every request opcode
(``rxe_golden_guest.py``) to a QP number nobody owns on the host address, and
keeps the first frame of each opcode, as captured (Ethernet, IPv4 with the
kernel's IP ID, UDP, BTH..., ICRC), in opcode order.  Nothing answers, so the
requests go out once each (retries come seconds later and are ignored).
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from ibal.lab import Lab, LabSession  # noqa: E402
from ibal.providers.rxe import wire  # noqa: E402
from ibal.providers.rxe.packet import Opcode  # noqa: E402
from ibal.wire.pcap import LINKTYPE_ETHERNET, PcapWriter  # noqa: E402

OUT = HERE / "rxe-golden" / "kernel-rxe-requests.pcap"
FAKE_QPN = 0x000ABC
ETH_P_ALL = 0x0003

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


def write(found: dict[Opcode, tuple[float, bytes]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with PcapWriter(out, LINKTYPE_ETHERNET) as w:
        for op in sorted(found):
            ts, frame = found[op]
            w.write(frame, ts)


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    with Lab().session(net=True) as s:
        found = capture(s)
    write(found, out)
    print(f"{len(found)} frames -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
