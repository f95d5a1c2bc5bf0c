"""The rdma_core provider's port counters, read from a sysfs tree the test builds."""

from __future__ import annotations

from pathlib import Path

from ibal.providers.rdma_core import counters


def _tree(root: Path) -> None:
    hw = root / "rxe0" / "ports" / "1" / "hw_counters"
    iba = root / "rxe0" / "ports" / "1" / "counters"
    hw.mkdir(parents=True)
    iba.mkdir(parents=True)
    (hw / "sent_pkts").write_text("12\n")
    (hw / "rcvd_pkts").write_text("7\n")
    (hw / "lifespan").write_text("10\n")  # a knob, not a counter
    (hw / "broken").write_text("n/a\n")
    (iba / "port_xmit_packets").write_text("3\n")
    (iba / "sent_pkts").write_text("99\n")  # hw_counters' meaning wins


def test_reads_every_numeric_counter(tmp_path: Path) -> None:
    _tree(tmp_path)
    got = counters.read("rxe0", 1, root=str(tmp_path))
    assert got == {"sent_pkts": 12, "rcvd_pkts": 7, "port_xmit_packets": 3}


def test_availability_names_what_is_missing(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert counters.availability("rxe0", root=str(tmp_path)) is None
    why = counters.availability("mlx9", root=str(tmp_path))
    assert why is not None and "mlx9/ports/1" in why
    assert counters.read("mlx9", 1, root=str(tmp_path)) == {}
