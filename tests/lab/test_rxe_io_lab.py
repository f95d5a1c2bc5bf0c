"""The rxe socket layer against kernel rxe over the lab link, both directions.

Requests leave through ``DeviceIO`` (raw socket, per-packet source port, ICRC
over the IP header the kernel builds); kernel rxe in the guest drops any frame
whose ICRC is wrong, so its answers and the bytes that land prove the send
path.  Its responses come back through ``DeviceIO``'s raw receive path, which
checks each ICRC over the kernel's own IP ID.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import queue
import time
from pathlib import Path

import pytest

from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.providers.rxe import wire
from ibal.providers.rxe.io import DeviceIO
from ibal.wire.packet import Opcode, Packet

pytestmark = pytest.mark.lab

_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "make_rxe_golden.py"
_RESPONDER = _SCRIPT.parent / "rxe_golden_responder.py"


def test_device_io_talks_to_kernel_rxe(ibal_lab_net: LabSession) -> None:
    lab_requires("pyverbs")
    spec = importlib.util.spec_from_file_location("make_rxe_golden", _SCRIPT)
    assert spec is not None and spec.loader is not None
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    session = ibal_lab_net
    cfg = session.net_config
    assert cfg is not None
    info = session.host_dir / "responder.txt"
    guest = session.guest_start(
        ["/usr/bin/python3", str(_RESPONDER), cfg.host_ip, hex(golden.HOST_QPN),
         hex(golden.RQ_PSN), session.guest_path(info)],
        timeout=120,
    )  # fmt: skip
    got: queue.Queue[tuple[int, int, bytes]] = queue.Queue()

    def on_packets(packets: list[Packet]) -> None:
        for p in packets:
            got.put((p.opcode, p.psn, p.src_ip))

    with session.in_netns():
        dev = DeviceIO(on_packets, name="lab")
        dev.add_address(ipaddress.ip_address(cfg.host_ip))
    try:
        deadline = time.monotonic() + 120
        while not info.exists():  # the guest writes it once its QP is ready
            assert not guest.done() and time.monotonic() < deadline, guest.wait().stdout_text
            time.sleep(0.2)
        qpn, rkey, addr = (int(x) for x in info.read_text().split())
        guest_ip = ipaddress.ip_address(cfg.guest_ip).packed
        sport = wire.connected_udp_sport(0, golden.HOST_QPN, qpn)
        for p in golden.host_requests(qpn, rkey, addr):
            dev.send(p, guest_ip, sport)
        dev.flush()
        seen: dict[int, int] = {}
        while set(seen) < set(golden.RESPONSES):
            op, psn, src = got.get(timeout=60)
            assert src == guest_ip
            seen.setdefault(op, psn)
        assert dev.counters.drops["bad_icrc"] == 0
        assert seen[Opcode.RC_ATOMIC_ACKNOWLEDGE] == golden.RQ_PSN + 6
        (session.host_dir / "responder.txt.go").write_text("check")
        said = guest.wait().stdout_text
    finally:
        dev.close()
        if not guest.done():
            guest.kill()
    lines = dict(line.split(" ", 1) for line in said.splitlines() if " " in line)
    assert lines["wc"] == "[(1, 0, 16)]"  # the SEND completed, 16 bytes
    assert bytes.fromhex(lines["send"]) == golden.SEND_DATA
    assert bytes.fromhex(lines["write"]) == golden.WRITE_DATA
