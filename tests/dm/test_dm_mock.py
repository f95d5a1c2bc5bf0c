"""IOCs and the DM agent on the mock fabric, with several AL instances.

A DM client on another CA's port reads what two AL instances registered on one
CA; every field is checked at IBA 16.3's raw offsets (DM data at MAD byte 64),
not through ``ibal.wire.mad.dm``'s tables.  The capability bit is read back through
the SA's PortInfoRecords and the SMA.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from dm_world import DmClient, status

from ibal.al import AccessLayer, AlManager, Ca
from ibal.dm import DmService, Ioc, create_ioc
from ibal.dm.iou import DEFAULT_MAX_CONTROLLERS
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa import port_info_records
from ibal.status import (
    InsufficientResources,
    InvalidCaHandle,
    InvalidHandle,
    InvalidParameter,
    InvalidState,
)
from ibal.types import IocProfile, MadAddr, PortCap, SvcEntry
from ibal.wire.mad import header as H
from ibal.wire.mad import smp
from ibal.wire.mad.consts import Method, MgmtClass, SmpAttr

DM_BIT = int(PortCap.IS_DEV_MGMT_SUPPORTED)


@dataclass
class World:
    fabric: MockFabric
    mgr: AlManager
    al1: AccessLayer
    al2: AccessLayer
    ca1: Ca  # al1's handle on the IOC CA
    ca2: Ca  # al2's handle on the same CA
    client: DmClient
    to_iou: MadAddr
    iou_lid: int


@pytest.fixture
def world() -> Iterator[World]:
    fabric = MockFabric(seed=3)
    for _ in range(3):
        fabric.add_ca()
    mgr = AlManager()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al1, al2, alc = mgr.open_al(), mgr.open_al(), mgr.open_al()
        iou_guid, client_guid = al1.get_ca_guids()[1:3]
        ca1, ca2 = al1.open_ca(iou_guid), al2.open_ca(iou_guid)
        lid = ca1.query_port(1).lid
        client = DmClient(alc, client_guid)
        yield World(fabric, mgr, al1, al2, ca1, ca2, client, MadAddr(remote_qp=1, dlid=lid), lid)
    finally:
        mgr.close(timeout=10)
        fabric.close()


def profile(guid: int, text: str = "ibal test IOC") -> IocProfile:
    return IocProfile(ioc_guid=guid, vend_id=0x123456, dev_id=0x89ABCDEF, dev_version=0x1234,
                      subsys_vend_id=0x654321, subsys_id=0x0BADCAFE, io_class=0x0100,
                      io_subclass=0x609E, protocol=0x0108, protocol_ver=0x0001,
                      send_msg_depth=0x0203, rdma_read_depth=4, send_msg_size=0x12345678,
                      rdma_size=0x00100000, ctrl_ops_cap=0xA5, id_string=text)  # fmt: skip


def check_profile(data: bytes, p: IocProfile, entries: int) -> None:
    """IOControllerProfile at IBA 16.3.3.4's byte offsets (data relative, 128 bytes)."""
    assert struct.unpack(">Q", data[0:8])[0] == p.ioc_guid
    assert data[8:11] == p.vend_id.to_bytes(3, "big") and data[11] == 0
    assert struct.unpack(">I", data[12:16])[0] == p.dev_id
    assert struct.unpack(">H", data[16:18])[0] == p.dev_version and data[18:20] == b"\0\0"
    assert data[20:23] == p.subsys_vend_id.to_bytes(3, "big") and data[23] == 0
    assert struct.unpack(">I", data[24:28])[0] == p.subsys_id
    assert struct.unpack(">4H", data[28:36]) == (p.io_class, p.io_subclass, p.protocol,
                                                 p.protocol_ver)  # fmt: skip
    assert data[36:40] == bytes(4)
    assert struct.unpack(">H", data[40:42])[0] == p.send_msg_depth and data[42] == 0
    assert data[43] == p.rdma_read_depth
    assert struct.unpack(">II", data[44:52]) == (p.send_msg_size, p.rdma_size)
    assert (data[52], data[53], data[54]) == (p.ctrl_ops_cap, 0, entries)
    assert data[55:64] == bytes(9)
    assert data[64:128] == p.id_string.encode().ljust(64, b"\0")


def slots(mad: bytes, n: int) -> list[int]:
    """The 4-bit controller states of IOUnitInfo (slot 1 the high nibble of byte 68)."""
    return [(mad[68 + i // 2] >> (0 if i % 2 else 4)) & 0xF for i in range(n)]


def test_two_als_export_iocs_a_client_reads_every_field(world: World) -> None:
    w = world
    p1, p2 = profile(0x0002C90300001111), profile(0x0002C90300002222, "second")
    ioc1, ioc2 = create_ioc(w.ca1, p1), create_ioc(w.ca2, p2)
    e1 = [ioc1.add_svc_entry(SvcEntry(f"SRP.T10:{i:04x}", 0x0002C90300000000 + i))
          for i in range(6)]  # fmt: skip
    assert ioc1.register() == 1 and ioc2.register() == 2
    ioc2.add_svc_entry(SvcEntry("only", 0xFFFF_FFFF_FFFF_FFFF))  # after registration: exported

    iu = w.client.get(0x0010, w.to_iou)
    assert status(iu) == 0
    change = struct.unpack(">H", iu[64:66])[0]
    assert iu[66] == DEFAULT_MAX_CONTROLLERS and iu[67] == 0
    assert slots(iu, 18) == [1, 1] + [0] * 14 + [0xF, 0xF]
    assert iu[24:64] == bytes(40)

    for slot, p, n in ((1, p1, 6), (2, p2, 1)):
        m = w.client.get(0x0011, w.to_iou, slot)
        assert status(m) == 0
        check_profile(m[64:192], p, n)
        assert m[192:] == bytes(64)

    m = w.client.get(0x0012, w.to_iou, 1 << 16 | 5 << 8 | 2)  # slot 1, entries 2..5
    assert status(m) == 0
    for i in range(4):
        at = 64 + 48 * i
        assert m[at : at + 40] == f"SRP.T10:{2 + i:04x}".encode().ljust(40, b"\0")
        assert struct.unpack(">Q", m[at + 40 : at + 48])[0] == 0x0002C90300000002 + i
    m = w.client.get(0x0012, w.to_iou, 2 << 16)
    assert m[64:104] == b"only".ljust(40, b"\0") and m[104:112] == b"\xff" * 8
    assert m[112:] == bytes(144)

    # Removing an entry changes the export and the change ID.
    e1[0].remove()
    iu = w.client.get(0x0010, w.to_iou)
    assert struct.unpack(">H", iu[64:66])[0] == change + 1
    m = w.client.get(0x0012, w.to_iou, 1 << 16)
    assert m[64:104] == b"SRP.T10:0001".ljust(40, b"\0")
    check_profile(w.client.get(0x0011, w.to_iou, 1)[64:192], p1, 5)
    assert status(w.client.get(0x0012, w.to_iou, 1 << 16 | 5 << 8 | 5)) == 0x001C  # 5 left

    # Destroying an IOC unexports it: its slot empties, its profile is "no IOC".
    ioc1.destroy()
    iu = w.client.get(0x0010, w.to_iou)
    assert slots(iu, 2) == [0, 1] and struct.unpack(">H", iu[64:66])[0] == change + 2
    assert status(w.client.get(0x0011, w.to_iou, 1)) == 0x0100
    assert status(w.client.get(0x0011, w.to_iou, 0)) == 0x001C
    assert status(w.client.get(0x0011, w.to_iou, 17)) == 0x001C
    with pytest.raises(InvalidHandle):
        e1[1].remove()  # gone with its IOC
    ioc3 = create_ioc(w.ca1, profile(0x33))
    assert ioc3.register() == 1  # the lowest free slot
    assert status(w.client.get(0x0012, w.to_iou, 1 << 16)) == 0x0200  # no entries at all


def pir_cap(w: World) -> int:
    [pir] = port_info_records(w.client.ca.al, lid=w.iou_lid, port_guid=w.client.port.port_guid,
                              timeout_ms=2000)  # fmt: skip
    return int(pir.capability_mask)


def sma_cap(ca: Ca) -> int:
    mad = H.build(MgmtClass.SUBN_DR, Method.GET, SmpAttr.PORT_INFO, tid=9, dr_path=[])
    resp = ca.local_mad(1, bytes(mad))
    return int(smp.PORT_INFO.decode(resp[H.SMP_DATA : H.SMP_DATA + 64])["capability_mask"])


def test_capability_bit_follows_the_exports(world: World) -> None:
    w = world
    base = sma_cap(w.ca1)
    assert not pir_cap(w) & DM_BIT and not base & DM_BIT
    a, b = create_ioc(w.ca1, profile(1)), create_ioc(w.ca2, profile(2))
    assert not pir_cap(w) & DM_BIT  # created, not registered: nothing exported
    a.register()
    assert pir_cap(w) & DM_BIT and sma_cap(w.ca1) == base | DM_BIT  # only that bit changed
    assert w.ca2.query_port(1).cap & PortCap.IS_DEV_MGMT_SUPPORTED
    b.register()
    a.destroy()
    assert pir_cap(w) & DM_BIT  # b still exported
    b.destroy()
    assert not pir_cap(w) & DM_BIT and sma_cap(w.ca1) == base


def test_iocs_die_with_their_ca_handle_and_al(world: World) -> None:
    w = world
    a = create_ioc(w.ca1, profile(1))
    entry = a.add_svc_entry(SvcEntry("x", 1))
    a.register()
    b = create_ioc(w.ca2, profile(2))
    b.register()
    w.ca1.close(wait=True)
    with pytest.raises(InvalidHandle):
        a.register()
    with pytest.raises(InvalidHandle):
        entry.remove()
    assert slots(w.client.get(0x0010, w.to_iou), 2) == [0, 1]
    assert pir_cap(w) & DM_BIT
    w.al2.close()
    assert slots(w.client.get(0x0010, w.to_iou), 2) == [0, 0]
    assert not pir_cap(w) & DM_BIT


def test_limits_and_bad_handles(world: World) -> None:
    w = world
    with pytest.raises(InvalidCaHandle):
        create_ioc(w.al1, profile(1))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        create_ioc(w.ca1, SvcEntry("x", 1))  # type: ignore[arg-type]
    iocs = [create_ioc(w.ca1 if i % 2 else w.ca2, profile(i)) for i in range(17)]
    for ioc in iocs[:DEFAULT_MAX_CONTROLLERS]:
        ioc.register()
    with pytest.raises(InsufficientResources):
        iocs[16].register()
    with pytest.raises(InvalidState):
        iocs[0].register()
    iocs[3].destroy()
    assert iocs[16].register() == 4
    with pytest.raises(InvalidHandle):
        iocs[3].add_svc_entry(SvcEntry("x", 1))
    with pytest.raises(InvalidParameter):
        iocs[0].add_svc_entry(("x", 1))  # type: ignore[arg-type]
    handles = [iocs[0].add_svc_entry(SvcEntry(f"s{i}", i)) for i in range(255)]
    with pytest.raises(InsufficientResources):
        iocs[0].add_svc_entry(SvcEntry("one too many", 256))
    assert len(iocs[0].entries) == 255 and iocs[0].profile.num_svc_entries == 255
    handles[7].remove()
    with pytest.raises(InvalidHandle):
        handles[7].remove()
    assert len(iocs[0].entries) == 254
    m = w.client.get(0x0012, w.to_iou, iocs[0].slot << 16 | 253 << 8 | 250)
    names = [m[64 + 48 * i : 64 + 48 * i + 40].rstrip(b"\0") for i in range(4)]
    assert names == [b"s251", b"s252", b"s253", b"s254"]
    c = w.al1.open_ca(w.ca1.guid)
    c.close(wait=True)
    with pytest.raises(InvalidCaHandle):
        create_ioc(c, profile(99))


def test_forged_and_unsupported_requests(world: World) -> None:
    w = world
    ioc = create_ioc(w.ca1, profile(1))
    ioc.register()
    svc = DmService.of(w.mgr)
    assert svc is not None
    agent = svc.agent(w.ca1.query_port(1).port_guid)
    assert agent is not None
    # Set of a read-only attribute, Get of a diagnostic the agent lacks.
    for attr in (0x0001, 0x0010, 0x0011, 0x0012, 0x0021, 0x0022):
        assert status(w.client.get(attr, w.to_iou, 1, Method.SET)) == 0x000C
    assert status(w.client.get(0x0020, w.to_iou)) == 0x000C
    assert (agent.stats["answered"], agent.stats["answered_error"]) == (0, 7)
    port_stats = agent.service.alias.transport_stats
    # Another class version never reaches the agent: the AL answers it "bad version"; a
    # forged Get with an active RMPP header reaches the agent's service, which drops it.
    bad = bytearray(H.build(MgmtClass.DEV_MGT, Method.GET, 0x0010, tid=5))
    bad[2] = 2
    forged = bytearray(H.build(MgmtClass.DEV_MGT, Method.GET, 0x0010, tid=6))
    forged[24:28] = b"\x01\x01\x07\x00"  # RMPP v1, DATA, first|last|active
    for mad in (bad, forged):
        e = w.client.service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = w.to_iou
        w.client.service.send(e)  # sent as is: nothing waits for an answer
    m = w.client.get(0x0010, w.to_iou)  # after them, on the same path: the agent still answers
    assert status(m) == 0 and slots(m, 1) == [1]
    w.mgr.queues.flush(timeout=10)
    after = agent.service.alias.transport_stats
    assert after.get("answered_0x0004", 0) == port_stats.get("answered_0x0004", 0) + 1
    assert agent.service.stats["dropped_rmpp_unsupported"] == 1
    assert (agent.stats["answered"], agent.stats["answered_error"]) == (1, 7)


def test_c_spellings(world: World) -> None:
    from ibal import compat

    w = world
    ioc = compat.ib_create_ioc(w.ca1, profile(0x77))
    h_svc = compat.ib_add_svc_entry(ioc, SvcEntry("c", 5))
    compat.ib_reg_ioc(ioc)
    m = w.client.get(0x0012, w.to_iou, 1 << 16)
    assert m[64:65] == b"c" and m[104:112] == (5).to_bytes(8, "big")
    compat.ib_remove_svc_entry(h_svc)
    with pytest.raises(InvalidHandle):
        compat.ib_remove_svc_entry(h_svc)
    with pytest.raises(InvalidHandle):
        compat.ib_remove_svc_entry(ioc)
    with pytest.raises(InvalidHandle):
        compat.ib_reg_ioc(w.ca1)
    compat.ib_destroy_ioc(ioc)
    with pytest.raises(InvalidHandle):
        compat.ib_destroy_ioc(ioc)
    assert status(w.client.get(0x0011, w.to_iou, 1)) == 0x0100


def test_hot_added_ca_gets_an_agent_and_leaves_nothing_behind(world: World) -> None:
    w = world
    svc = DmService.start(w.mgr)
    hot = w.fabric.hotplug_add("hot", ports=1)
    w.mgr.queues.flush(timeout=10)
    port = hot.ports[0]
    agent = svc.agent(port.guid)
    assert agent is not None and agent.alive
    ca = w.al1.open_ca(hot.guid)
    ioc = create_ioc(ca, profile(0x4040))
    ioc.register()
    to_hot = MadAddr(remote_qp=1, dlid=ca.query_port(1).lid)
    assert slots(w.client.get(0x0010, to_hot), 1) == [1]
    assert ca.query_port(1).cap & PortCap.IS_DEV_MGMT_SUPPORTED
    before = len(svc.agents)
    w.fabric.hotplug_remove(hot)
    w.mgr.queues.flush(timeout=10)
    assert not agent.alive and svc.agent(port.guid) is None and len(svc.agents) == before - 1
    assert not ioc.alive and not ioc.unit.exporting
    with pytest.raises(InvalidHandle):
        ioc.add_svc_entry(SvcEntry("x", 1))
    assert status(w.client.get(0x0010, w.to_iou)) == 0  # the other agents still answer


def test_ioc_exported_from_a_pnp_callback(world: World) -> None:
    """A driver exporting an IOC when a CA arrives: the DM service starts inside the PnP
    callback (no synchronous replay there); its agent still comes and sets the bit."""
    from ibal.al import PnpClass, PnpEvent, PnpRec

    w = world
    made: list[Ioc] = []

    def on_ca(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_ADD and rec.guid not in (w.ca1.guid, w.client.ca.guid):
            ioc = create_ioc(w.al2.open_ca(rec.guid), profile(0x5151))
            ioc.register()
            made.append(ioc)

    assert DmService.of(w.mgr) is None
    w.al2.reg_pnp(PnpClass.CA, on_ca)
    hot = w.fabric.hotplug_add("hot2", ports=1)
    w.mgr.queues.flush(timeout=10)
    w.mgr.queues.flush(timeout=10)
    assert len(made) == 2 and all(i.slot == 1 for i in made)  # mock0 (replayed) and hot2
    port = w.al1.query_ca_by_guid(hot.guid).ports[0]
    assert port.cap & PortCap.IS_DEV_MGMT_SUPPORTED
    m = w.client.get(0x0011, MadAddr(remote_qp=1, dlid=port.lid), 1)
    assert status(m) == 0 and struct.unpack(">Q", m[64:72])[0] == 0x5151
