"""The golden-frame capture still works: kernel rxe in the lab sends every request opcode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ibal.lab import LabSession
from ibal.lab.pytest_plugin import lab_requires
from ibal.providers.rxe import wire

pytestmark = pytest.mark.lab

_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "make_rxe_golden.py"


def test_kernel_rxe_sends_every_request_opcode_with_a_valid_icrc(
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
