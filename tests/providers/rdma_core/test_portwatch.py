"""The MAD-only CA's port watch (pure functions) and its verbs that need no fabric."""

from __future__ import annotations

import pytest

from ibal.providers.rdma_core import portwatch, umad
from ibal.providers.rdma_core.umad_ca import UmadCa
from ibal.status import InvalidCaHandle, Unsupported
from ibal.types import AsyncEvent, LinkState, Mtu, QpCaps, QpType


def _portinfo(**values: int) -> bytes:
    base = {"gid_prefix": 0xFE80 << 48, "lid": 3, "master_sm_lid": 1, "port_state": 4,
            "lmc": 0, "neighbor_mtu": 4, "mtu_cap": 5, "link_width_active": 2,
            "link_speed_active": 1, "vl_cap": 4, "subnet_timeout": 18}  # fmt: skip
    return portwatch.PORT_INFO.encode({**base, **values})


def test_local_smp_is_a_directed_route_get_at_hop_zero() -> None:
    mad = portwatch.local_smp(0x1234, portwatch.ATTR_PORT_INFO, 0)
    assert len(mad) == 256
    assert mad[0:4] == bytes([1, 0x81, 1, 0x01])
    assert mad[6] & 0x3F == 0 and mad[7] == 0  # hop pointer, hop count
    assert int.from_bytes(mad[8:16], "big") == 0x1234
    assert int.from_bytes(mad[16:18], "big") == 0x15
    assert mad[32:36] == b"\xff" * 4


def test_port_attr_from_portinfo() -> None:
    a = portwatch.port_attr(1, 0x100003, _portinfo(lid=7, master_sm_lid=2, lmc=1),
                            (0xFFFF, 0x8001))  # fmt: skip
    assert (a.lid, a.lmc, a.sm_lid, a.link_state) == (7, 1, 2, LinkState.ACTIVE)
    assert (a.active_mtu, a.max_mtu, a.active_width, a.max_vls) == (
        Mtu.MTU_2048, Mtu.MTU_4096, "4X", 8)
    assert str(a.gids[0]) == "fe80::10:3"
    assert a.pkeys == (0xFFFF, 0x8001)
    assert a.subnet_timeout == 18


@pytest.mark.parametrize(
    ("before", "after", "events"),
    [
        ({}, {"port_state": 1}, [AsyncEvent.PORT_DOWN]),
        ({"port_state": 1}, {"port_state": 2}, []),
        ({"port_state": 3}, {}, [AsyncEvent.PORT_ACTIVE]),
        ({}, {"lid": 9}, [AsyncEvent.LID_CHANGE]),
        ({}, {"master_sm_lid": 5}, [AsyncEvent.SM_CHANGE]),
        ({}, {"port_state": 1, "lid": 9}, [AsyncEvent.PORT_DOWN, AsyncEvent.LID_CHANGE]),
        ({}, {}, []),
    ],
)
def test_port_events(before: dict[str, int], after: dict[str, int],
                     events: list[AsyncEvent]) -> None:  # fmt: skip
    old = portwatch.port_attr(1, 5, _portinfo(**before), (0xFFFF,))
    new = portwatch.port_attr(1, 5, _portinfo(**after), (0xFFFF,))
    assert portwatch.port_events(old, new) == events


def test_pkey_change_and_block_decoding() -> None:
    mad = bytearray(256)
    mad[64:68] = bytes.fromhex("ffff8001")
    block = portwatch.pkey_block(bytes(mad))
    assert len(block) == 32 and block[:3] == (0xFFFF, 0x8001, 0)
    old = portwatch.port_attr(1, 5, _portinfo(), (0xFFFF,))
    new = portwatch.port_attr(1, 5, _portinfo(), block)
    assert portwatch.port_events(old, new) == [AsyncEvent.PKEY_CHANGE]


def _info() -> umad.UmadCaInfo:
    port = umad.UmadPortInfo(
        port_num=1, port_guid=0x100003, gid_prefix=0xFE80 << 48, lid=3, lmc=0, sm_lid=1,
        sm_sl=0, state=4, phys_state=5, rate=10, capmask=0, pkeys=(0xFFFF, 0),
        link_layer="IB",
    )  # fmt: skip
    return umad.UmadCaInfo("ibsim0", 1, 0x100002, 0x100002, "1", "simulator", "a1", (port,))


def test_mad_only_ca_before_open() -> None:
    ca = UmadCa(_info())
    caps = ca.capabilities
    assert caps.qp_types == frozenset() and caps.mad_agents
    assert "MAD-only" in caps.reason("qp_types")
    attr = ca.ca_attr()
    assert attr.ca_guid == 0x100002 and attr.port(1).lid == 3
    assert attr.port(1).link_state is LinkState.ACTIVE
    with pytest.raises(InvalidCaHandle):
        ca.query_ca(object())
    with pytest.raises(Unsupported, match="MAD-only CA"):
        ca.create_qp(object(), QpType.UD, QpCaps(), object(), object(), None, True, None)
    with pytest.raises(Unsupported, match="MAD-only CA"):
        ca.create_cq(object(), 16, None)


class _Registrar:
    def __init__(self) -> None:
        self.cis: list[object] = []

    def register_ca(self, ci: object) -> None:
        self.cis.append(ci)

    def deregister_ca(self, guid: int) -> None:
        self.cis = [c for c in self.cis if getattr(c, "guid", None) != guid]


def test_provider_registers_a_mad_only_ca_per_umad_ca_without_verbs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ibal.providers.rdma_core import loader, provider

    def no_pyverbs() -> None:
        raise loader.PyverbsUnavailable("No module named 'pyverbs'")

    monkeypatch.setattr(loader, "load", no_pyverbs)
    monkeypatch.setattr(umad, "umad_cas", lambda: ["ibsim0", "mlx5_0"])
    monkeypatch.setattr(umad, "ca_info", lambda name: _info())
    monkeypatch.setattr(provider, "_sysfs_verbs_devices", lambda: {"mlx5_0"})
    p = provider.RdmaCoreProvider({"watch_interval": 0.5})
    reg = _Registrar()
    p.start(reg)  # type: ignore[arg-type]
    assert [type(c).__name__ for c in reg.cis] == ["UmadCa"]  # mlx5_0 is a verbs device
    assert p.unavailable_reason is None
    p.stop()
    assert reg.cis == []
    off = provider.RdmaCoreProvider({"mad_only": False})
    off.start(_Registrar())  # type: ignore[arg-type]
    assert off.unavailable_reason is not None
    assert off.unavailable_reason.startswith("pyverbs not importable")
