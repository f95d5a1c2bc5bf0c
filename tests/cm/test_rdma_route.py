"""``ibal.cm.rdma.resolve_route`` (rdma_resolve_addr + rdma_resolve_route) on rxe devices on lo.

Two ibal rxe devices bound to loopback addresses of this test's own; the path
comes from ``ibal.sa.roce`` through the SA query API.  Against the kernel's
rdma_cm the same resolution is compared in tests/sa/test_roce_lab.py.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterator

import pytest

from ibal.al import AccessLayer
from ibal.cm.rdma import resolve_route
from ibal.status import InvalidParameter, NotFound
from ibal.testing.helpers import rxe_al
from ibal.types import Gid, Mtu

A, B = "127.0.0.41", "127.0.0.42"


@pytest.fixture(scope="module")
def al() -> Iterator[AccessLayer]:
    with rxe_al(f"rxe_cr0={A},rxe_cr1={B}") as al:
        yield al


def _port_of(al: AccessLayer, ip: str) -> tuple[int, int]:
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        for p in ca.query().ports:
            if any(e.gid == Gid(f"::ffff:{ip}") for e in p.gid_table):
                return guid, p.port_guid
    raise AssertionError(f"no port has {ip}")


def test_route_from_a_given_source(al: AccessLayer) -> None:
    r = resolve_route(al, B, src=A)
    assert (r.src, r.dst) == (ipaddress.IPv4Address(A), ipaddress.IPv4Address(B))
    assert (r.ca_guid, r.port_guid) == _port_of(al, A)
    assert (r.sgid, r.dgid) == (Gid(f"::ffff:{A}"), Gid(f"::ffff:{B}"))
    assert r.sgid_index == 0  # the device's one address
    p = r.path
    assert (p["sgid"], p["dgid"]) == (r.sgid.packed, r.dgid.packed)
    # lo's 65536-byte MTU carries 4096, the rxe port's active MTU; the rest as Linux
    assert (p["mtu"], p["hop_limit"], p["p_key"], p["packet_life_time"]) == (
        Mtu.MTU_4096, 64, 0xFFFF, 16,
    )  # fmt: skip


def test_route_from_the_other_device_and_without_a_source(al: AccessLayer) -> None:
    r = resolve_route(al, A, src=B)
    assert (r.ca_guid, r.port_guid) == _port_of(al, B)
    r = resolve_route(al, ipaddress.IPv4Address(B))
    assert str(r.src) in (A, B)  # a local destination: any routable GID of a RoCE port
    assert r.path["sgid"] == Gid(f"::ffff:{r.src}").packed


def test_bad_addresses_are_refused(al: AccessLayer) -> None:
    with pytest.raises(InvalidParameter, match="not an IP address"):
        resolve_route(al, "10.0.0.300")
    with pytest.raises(InvalidParameter, match="different IP versions"):
        resolve_route(al, "fd00::1", src=A)
    with pytest.raises(NotFound, match=r"127\.0\.0\.99"):
        resolve_route(al, B, src="127.0.0.99")
    with pytest.raises(NotFound, match="GUID"):
        resolve_route(al, B, port_guid=0x1234)


def test_init_qp_moves_a_fresh_qp_to_init_on_the_route_port(al: AccessLayer) -> None:
    from ibal.al import QpCreate
    from ibal.cm.ops import DEFAULT_ACCESS
    from ibal.cm.rdma import init_qp
    from ibal.status import InvalidQpState, InvalidSetting
    from ibal.types import QpState, QpType

    r = resolve_route(al, B, src=A)
    ca = al.open_ca(r.ca_guid)
    pd = ca.alloc_pd()
    cq = ca.create_cq(8)
    qp = pd.create_qp(QpCreate(QpType.RC, cq, cq, sq_depth=1, rq_depth=1))
    init_qp(qp, r)
    attr = qp.query()
    assert (attr.state, attr.port_num, attr.pkey_index) == (QpState.INIT, r.port_num, 0)
    assert attr.access == DEFAULT_ACCESS  # what the CM's own INIT would set
    with pytest.raises(InvalidQpState):
        init_qp(qp, r)  # only a new QP
    other = resolve_route(al, A, src=B)  # the other device's CA
    qp2 = pd.create_qp(QpCreate(QpType.RC, cq, cq, sq_depth=1, rq_depth=1))
    with pytest.raises(InvalidSetting, match="route's CA"):
        init_qp(qp2, other)
    bad = dataclasses.replace(r, path={**r.path, "p_key": 0x1234})
    with pytest.raises(InvalidSetting, match="P_Key 0x1234"):
        init_qp(qp2, bad)
    assert qp2.state is QpState.RESET
    ca.close()
