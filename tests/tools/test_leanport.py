"""The lean MAD path's choice of port: as ``pick_port`` chooses, else the AL (None)."""

from __future__ import annotations

import pytest

from ibal.providers.rdma_core import umad
from ibal.tools.leanport import lean_port


def _port(num: int, state: int, guid: int) -> umad.UmadPortInfo:
    return umad.UmadPortInfo(port_num=num, port_guid=guid, gid_prefix=0xFE80 << 48, lid=num,
                             lmc=0, sm_lid=1, sm_sl=0, state=state, phys_state=5, rate=10,
                             capmask=0, pkeys=(0xFFFF,), link_layer="InfiniBand")  # fmt: skip


_CAS = {
    "mlx5_0": umad.UmadCaInfo(name="mlx5_0", node_type=1, node_guid=0xA0, system_guid=0xA0,
                              fw_ver="", ca_type="", hw_ver="",
                              ports=(_port(1, 1, 0xA1), _port(2, 1, 0xA2))),
    "mlx5_1": umad.UmadCaInfo(name="mlx5_1", node_type=1, node_guid=0xB0, system_guid=0xB0,
                              fw_ver="", ca_type="", hw_ver="",
                              ports=(_port(1, 4, 0xB1),)),
}  # fmt: skip


@pytest.fixture
def fake_umad(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """libibumad listing two CAs (the first with no active port); ``availability`` per CA."""
    avail: dict[str, str | None] = {"mlx5_0": None, "mlx5_1": None}
    monkeypatch.setattr(umad, "umad_cas", lambda: list(_CAS))
    monkeypatch.setattr(umad, "ca_info", lambda name: _CAS[name])
    monkeypatch.setattr(umad, "under_umad2sim", lambda: False)
    monkeypatch.setattr(umad, "availability", lambda name, port=1: avail[name])
    monkeypatch.setattr(umad, "agents_for", lambda name: object())
    return avail


def test_the_first_active_port_or_the_one_asked_for(fake_umad: dict[str, str | None]) -> None:
    p = lean_port(None, None)
    assert p is not None and (p.ca_name, p.port_num, p.port_guid) == ("mlx5_1", 1, 0xB1)
    p = lean_port("mlx5_0", 2)  # -C/-P: that port, active or not (as pick_port)
    assert p is not None and (p.ca_name, p.port_num, p.link_layer) == ("mlx5_0", 2,
                                                                       "InfiniBand")
    p = lean_port("0x00000000000000b0", None)  # no: a GUID matches as pick_port's forms
    assert p is None
    p = lean_port(f"{0xB0:016x}", None)
    assert p is not None and p.ca_name == "mlx5_1"
    assert lean_port("mlx5_0", None) is None  # no active port: the AL says so in its words


def test_a_ca_the_kernel_does_not_serve_goes_to_the_al(fake_umad: dict[str, str | None],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake_umad["mlx5_1"] = "umad_open_port mlx5_1 1: Permission denied"
    assert lean_port(None, None) is None

    def gone() -> list[str]:
        raise umad.UmadUnavailable("libibumad.so.3 not found")

    monkeypatch.setattr(umad, "umad_cas", gone)
    assert lean_port(None, None) is None
