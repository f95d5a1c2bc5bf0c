"""The DM agent over RoCE: two managers, each with one userspace rxe device on loopback.

Manager A exports an IOC; a DM client of manager B asks A's port over QP1
(GRH-addressed, as RoCE needs) and gets every attribute; A's port advertises
IsDeviceManagementSupported through ``query_port`` while the IOC is exported.
With tshark, the captured GetResp is decoded by its InfiniBand dissector.
"""

from __future__ import annotations

import os
import struct
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dm_world import DmClient, status

from ibal.al import AlManager, Ca
from ibal.dm import create_ioc
from ibal.providers.rxe.provider import RxeProvider
from ibal.types import Grh, IocProfile, MadAddr, PortCap, SvcEntry
from ibal.wire.pcap import close_captures
from ibal.wire.tshark import tshark_path

ADDR_A, ADDR_B = "127.0.0.46", "127.0.0.47"


def need(what: str) -> None:
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{what} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(what)


@dataclass
class Pair:
    ca_a: Ca
    client: DmClient
    to_a: MadAddr
    capture: Path


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    if os.geteuid() != 0:
        need("needs root (rxe's raw sockets need CAP_NET_RAW)")
    capture = tmp_path / "dm.pcap"
    monkeypatch.setenv("IBAL_CAPTURE", str(capture))
    a, b = AlManager(), AlManager()
    try:
        a.add_provider(RxeProvider({"devices": f"rxe_dma={ADDR_A}"}))
        b.add_provider(RxeProvider({"devices": f"rxe_dmb={ADDR_B}"}))
        al_a, al_b = a.open_al(), b.open_al()
        ca_a = al_a.open_ca(al_a.get_ca_guids()[0])
        client = DmClient(al_b, al_b.get_ca_guids()[0])
        gid = ca_a.query_port(1).gid_table[0].gid
        yield Pair(ca_a, client, MadAddr(remote_qp=1, grh=Grh(dgid=gid)), capture)
    finally:
        b.close(timeout=10)
        a.close(timeout=10)
        close_captures()


def test_dm_gets_over_roce(pair: Pair) -> None:
    p = pair
    assert not p.ca_a.query_port(1).cap & PortCap.IS_DEV_MGMT_SUPPORTED
    ioc = create_ioc(p.ca_a, IocProfile(ioc_guid=0x0002C903000ABCDE, vend_id=0x0002C9,
                                        io_class=0x0100, protocol=0x0108, id_string="roce"))
    ioc.add_svc_entry(SvcEntry("SRP.T10:0002C903000ABCDE", 0x0002C903000ABCDE))
    assert ioc.register() == 1
    assert p.ca_a.query_port(1).cap & PortCap.IS_DEV_MGMT_SUPPORTED

    iu = p.client.get(0x0010, p.to_a)
    assert status(iu) == 0 and iu[66] == 16 and iu[68] == 0x10 and iu[69:76] == bytes(7)
    assert iu[76:196] == b"\xff" * 120  # slots 17..256 do not exist
    m = p.client.get(0x0011, p.to_a, 1)
    assert status(m) == 0
    assert struct.unpack(">Q", m[64:72])[0] == 0x0002C903000ABCDE
    assert m[72:75] == b"\x00\x02\xc9" and m[92:94] == b"\x01\x00" and m[96:98] == b"\x01\x08"
    assert m[118] == 1 and m[128:192] == b"roce".ljust(64, b"\0")
    m = p.client.get(0x0012, p.to_a, 1 << 16)
    assert m[64:104] == b"SRP.T10:0002C903000ABCDE".ljust(40, b"\0")
    assert struct.unpack(">Q", m[104:112])[0] == 0x0002C903000ABCDE
    assert status(p.client.get(0x0011, p.to_a, 2)) == 0x0100

    ioc.destroy()
    assert not p.ca_a.query_port(1).cap & PortCap.IS_DEV_MGMT_SUPPORTED
    assert p.client.get(0x0010, p.to_a)[68] == 0x00

    if tshark_path() is None:
        return  # optional: the answer's bytes were checked above
    close_captures()
    check_tshark(p.capture, iu)


def check_tshark(path: Path, answer: bytes) -> None:
    """tshark decodes the captured GetResp ``answer`` (matched by TID) as a DM IOUnitInfo
    response on QP1, its data the bytes the client got, nothing malformed."""
    exe = tshark_path()
    assert exe is not None
    r = subprocess.run([exe, "-n", "-r", os.fspath(path), "--disable-protocol", "rpcordma",
                        "-T", "pdml"], capture_output=True, text=True, timeout=300,
                       check=True)  # fmt: skip
    tid = f"0x{int.from_bytes(answer[8:16], 'big'):016x}"
    found = []
    for pkt in ET.fromstring(r.stdout).iter("packet"):
        d: dict[str, tuple[str, str]] = {}
        for f in pkt.iter("field"):
            d.setdefault(f.get("name", ""), (f.get("show", ""), f.get("value", "")))
        if d.get("infiniband.mad.transactionid", ("",))[0] == tid and \
                d["infiniband.mad.method"][0] == "0x81":
            found.append(d)
    assert found, tid  # one per device that captured it (A sending, B receiving)
    for d in found:
        assert d["infiniband.mad.mgmtclass"][0] == "0x06"
        assert d["infiniband.mad.classversion"][0] == "0x01"
        assert d["infiniband.mad.attributeid"][0] == "0x0010"
        assert d["infiniband.mad.status"][0] == "0x0000"
        assert int(d["infiniband.bth.destqp"][0], 0) == 1
        assert d["infiniband.mad.data"][1] == answer[24:].hex()  # DM header and IOUnitInfo
        assert "_ws.malformed" not in d and "_ws.expert.message" not in d


def test_rxe_modify_ca_capability_bits(pair: Pair) -> None:
    from ibal.status import InvalidPort, Unsupported
    from ibal.types import CaMod, PortAttrMod

    ca = pair.ca_a
    base = ca.query_port(1).cap
    ca.modify(1, CaMod.IS_SNMP_SUPPORTED | CaMod.IS_VEND_SUPPORTED,
              PortAttrMod(cap=PortCap.IS_SNMP_SUPPORTED))  # fmt: skip
    assert ca.query_port(1).cap == base | PortCap.IS_SNMP_SUPPORTED
    ca.modify(1, CaMod.IS_SNMP_SUPPORTED, PortAttrMod())
    assert ca.query_port(1).cap == base
    for bad in (CaMod.SHUTDOWN_PORT, CaMod.SYSTEM_IMAGE_GUID, CaMod.QKEY_CTR):
        with pytest.raises(Unsupported):
            ca.modify(1, bad, PortAttrMod())
    with pytest.raises(InvalidPort):
        ca.modify(2, CaMod.IS_SNMP_SUPPORTED, PortAttrMod())
    assert ca.query_port(1).cap == base
