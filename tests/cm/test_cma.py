"""The RDMA CM header and IP service IDs (ibal.cm.cma) against roce-wire.md 3.3."""

from __future__ import annotations

import ipaddress
import random

import pytest

from ibal.cm import cma
from ibal.cm.cma import CmaHeader, PortSpace
from ibal.types import Gid
from ibal.wire.fields import FieldError
from ibal.wire.mad import cm
from ibal.wire.mad.consts import CmAttr

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address


def test_port_spaces_and_service_ids_are_linuxs() -> None:
    assert {p.name: p.value for p in PortSpace} == {
        "IPOIB": 0x0002, "TCP": 0x0106, "UDP": 0x0111, "IB": 0x013F,
    }  # fmt: skip
    assert cma.service_id(PortSpace.TCP, 7174) == 0x0000000001061C06  # rping's REQ
    assert cma.service_id(PortSpace.TCP, 18515) == 0x0000000001064853  # perftest -R
    assert cma.service_id(PortSpace.UDP, 0) == 0x0000000001110000
    assert cma.SERVICE_ID_MASK == 0xFFFFFFFFFFFF0000
    assert cma.RDMA_UDP_QKEY == 0x01234567
    sid = cma.service_id(PortSpace.IB, 0xFFFF)
    assert sid & cma.SERVICE_ID_MASK == PortSpace.IB << 16
    assert (cma.port_space_of(sid), cma.port_of(sid)) == (PortSpace.IB, 0xFFFF)
    assert cma.port_space_of(0x0000000001061C06) is PortSpace.TCP


@pytest.mark.parametrize("sid", [0x0000000001071C06, 0x1000000001061C06, 0x0002C90300001234, 0])
def test_other_service_ids_have_no_port_space(sid: int) -> None:
    assert cma.port_space_of(sid) is None


@pytest.mark.parametrize(("ps", "port"), [(PortSpace.TCP, -1), (PortSpace.TCP, 65536), (0x99, 1)])
def test_bad_port_or_port_space_is_refused(ps: int, port: int) -> None:
    with pytest.raises(ValueError):
        cma.service_id(ps, port)


def test_ipv4_header_bytes() -> None:
    hdr = CmaHeader(V4("10.99.0.2"), V4("10.99.0.1"), 0x8592)
    raw = hdr.encode()
    # version 0, IPv4 in bits 7:4, the source port, then each address in the last 4
    # bytes of a 16-byte field after 12 zero bytes (what the lab's rping -c sent)
    want = "00 40 8592" + "00" * 12 + "0a630002" + "00" * 12 + "0a630001"
    assert raw.hex() == want.replace(" ", "")
    assert len(raw) == cma.CMA_HDR_SIZE == 36
    assert CmaHeader.decode(raw) == hdr
    dump = hdr.dump()
    assert "src_addr: 10.99.0.2" in dump and "dst_addr: 10.99.0.1" in dump
    assert "src_port: 34194" in dump


def test_ipv6_header_bytes() -> None:
    hdr = CmaHeader(V6("fd00::1"), V6("fd00::2"), 7174)
    raw = hdr.encode()
    assert raw[:4] == bytes([0, 0x60, 0x1C, 0x06])
    assert raw[4:20] == V6("fd00::1").packed and raw[20:36] == V6("fd00::2").packed
    assert CmaHeader.decode(raw + b"user") == hdr


def test_private_data_joins_header_and_user_data_within_the_rest_of_the_req() -> None:
    hdr = CmaHeader(V4("192.0.2.1"), V4("192.0.2.2"), 40000)
    assert cma.USER_PDATA_MAX == {CmAttr.REQ: 56, CmAttr.SIDR_REQ: 180}
    pd = cma.join_private_data(hdr, b"x" * 56)
    assert len(pd) == 92 == cm.PRIVATE_DATA_SIZE[CmAttr.REQ]
    mad = cm.cm_mad(CmAttr.REQ, 1, private_data=pd)
    got_hdr, user = cma.split_private_data(cm.parse_cm(mad).fields["private_data"])  # type: ignore[arg-type]
    assert (got_hdr, user) == (hdr, b"x" * 56)
    with pytest.raises(ValueError, match="at most 56 bytes"):
        cma.join_private_data(hdr, b"x" * 57)
    assert len(cma.join_private_data(hdr, b"y" * 180, CmAttr.SIDR_REQ)) == 216
    with pytest.raises(ValueError, match="at most 180 bytes"):
        cma.join_private_data(hdr, b"y" * 181, CmAttr.SIDR_REQ)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (bytes([1, 0x40]) + bytes(34), "cma_version"),  # another header version
        (bytes([0, 0x50]) + bytes(34), "ip_version"),  # neither IPv4 nor IPv6
        (bytes([0, 0x00]) + bytes(34), "ip_version"),  # AF_IB REQs carry no header
        (bytes([0, 0x40]) + bytes(20), None),  # short
    ],
)
def test_headers_linux_refuses_are_refused(raw: bytes, reason: str | None) -> None:
    with pytest.raises(FieldError) as e:
        CmaHeader.decode(raw)
    assert e.value.field == reason


def test_mixed_families_and_bad_ports_are_refused() -> None:
    with pytest.raises(ValueError, match="different IP versions"):
        CmaHeader(V4("10.0.0.1"), V6("::1"), 1)
    with pytest.raises(ValueError, match="16-bit"):
        CmaHeader(V4("10.0.0.1"), V4("10.0.0.2"), 70000)


def test_gids_of_addresses_are_ipv4_mapped_while_headers_are_not() -> None:
    assert cma.gid_of("10.99.0.2") == Gid("::ffff:10.99.0.2")
    assert cma.gid_of(V6("fd00::5")) == Gid("fd00::5")
    assert cma.ip_of(Gid("::ffff:10.99.0.2")) == V4("10.99.0.2")
    assert cma.ip_of(Gid("fd00::5")) == V6("fd00::5")
    hdr = CmaHeader(cma.ip_of(Gid("::ffff:10.0.0.1")), V4("10.0.0.2"), 1)  # type: ignore[arg-type]
    assert hdr.encode()[4:16] == bytes(12)


def test_ephemeral_ports_are_in_linuxs_default_range() -> None:
    rng = random.Random(5)
    ports = {cma.ephemeral_port(rng) for _ in range(200)}
    assert min(ports) >= 32768 and max(ports) <= 60999 and len(ports) > 150
