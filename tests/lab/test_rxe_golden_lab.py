"""Golden frames from kernel rxe in the lab, and kernel rxe accepting ibal-encoded requests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.providers.rxe import wire
from ibal.wire.packet import Opcode, rnr_nak_syndrome

pytestmark = pytest.mark.lab

_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "make_rxe_golden.py"


def test_kernel_rxe_golden_frames_and_ibal_encoded_requests(
    ibal_lab_net: LabSession, tmp_path: Path
) -> None:
    lab_requires("pyverbs")
    spec = importlib.util.spec_from_file_location("make_rxe_golden", _SCRIPT)
    assert spec is not None and spec.loader is not None
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    found = golden.capture(ibal_lab_net)
    assert set(found) == set(golden.WANTED)
    for _, frame in found.values():
        f = wire.split_ethernet(frame)
        assert f is not None
        p = wire.decode_frame(f)  # raises on a bad ICRC
        assert p.dest_qpn == golden.FAKE_QPN
    out = tmp_path / "golden.pcap"
    golden.write(found, out)
    assert out.stat().st_size > 24

    # The other way: requests from ibal's encoder, which kernel rxe drops silently
    # if their ICRC is wrong; it answers each and the bytes land.
    responses, ours, guest_said = golden.capture_responses(ibal_lab_net)
    assert set(responses) == set(golden.RESPONSES), guest_said
    for frame in ours:  # what left the host: DF with IP ID 0, as the ICRC assumed
        f = wire.split_ethernet(frame)
        assert f is not None and f.ip_udp[4:8] == bytes.fromhex("00004000")
        wire.decode_frame(f)
    lines = dict(line.split(" ", 1) for line in guest_said.splitlines() if " " in line)
    assert lines["wc"] == "[(1, 0, 16)]"  # the SEND completed, 16 bytes
    assert bytes.fromhex(lines["send"]) == golden.SEND_DATA
    assert bytes.fromhex(lines["write"]) == golden.WRITE_DATA
    before = bytes((i * 7 + 3) & 0xFF for i in range(1024, 1032))
    after = int.from_bytes(before, "little") + 0x0101010101010101
    assert bytes.fromhex(lines["atomic"]) == after.to_bytes(8, "little")

    # NAKs, the RNR NAK and duplicates' answers (the stored capture's checks live in
    # tests/providers/rxe/test_rxe_golden.py, against ibal's responder too).
    seen, manifest = golden.capture_naks(ibal_lab_net)
    answers = []
    for _, frame in seen:
        f = wire.split_ethernet(frame)
        assert f is not None
        p = wire.decode_frame(f)
        if p.dest_qpn == golden.HOST_QPN:
            answers.append((Opcode(p.opcode).name, p.syndrome))
    ack, aack = "RC_ACKNOWLEDGE", "RC_ATOMIC_ACKNOWLEDGE"
    assert answers == [
        (ack, 0x1F), (aack, 0x1F), (ack, rnr_nak_syndrome(12)), (ack, 0x60), (aack, 0x1F),
        (ack, 0x1F), (ack, 0x62), (ack, 0x61),
    ], manifest  # fmt: skip
