"""IOC discovery on the mock fabric: the DM agent exports IOCs on one CA, the discovery client
finds them from every port, and IOU / IOC registrations of other AL instances get the events.

One manager, several AL instances (the agent's, the discovery client's, the users'); the
fabric and the AL share a :class:`ManualClock`, stepped by the test; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from discovery_world import Events, World, exported, make_world

from ibal.al import PnpClass, PnpEvent
from ibal.dm.discovery import ENHANCED_COMP_MASK, Discovery
from ibal.dm.ioc import create_ioc
from ibal.sa.port import SaPort
from ibal.status import InvalidParameter, InvalidState
from ibal.types import IocInfo, IocProfile, SvcEntry
from ibal.wire.mad import sa
from ibal.wire.mad.consts import Method, SaAttr
from ibal.wire.mad.smp import CapabilityMask
from ibal.wire.pcap import WIRESHARK_IB_PREF, close_captures
from ibal.wire.tshark import tshark_path


@pytest.fixture
def world() -> Iterator[World]:
    yield from make_world()


def test_mock_sa_matches_the_capability_mask_bitwise_with_modifier_bit_31(world: World) -> None:
    world.unit.take_slot(object(), exported(0x77, []))
    world.settle()
    port = SaPort.open(world.user, world.ports[2])
    try:
        data = sa.PORT_INFO_RECORD.encode(
            capability_mask=int(CapabilityMask.IS_DEVICE_MANAGEMENT_SUPPORTED))
        mask = sa.component_mask(sa.PORT_INFO_RECORD, ["capability_mask"])

        def lids(mod: int) -> list[int]:
            h = port.request(Method.GET_TABLE, SaAttr.PORT_INFO_RECORD, data, mask, attr_mod=mod)
            for _ in range(50):
                world.settle()
                if h.done:
                    break
                world.clock.advance(0.05, settle=world.settle)
            a = h.wait(0)
            assert a.ok, a
            return [sa.PORT_INFO_RECORD.decode(r[: sa.PORT_INFO_RECORD.size])["endport_lid"]
                    for r in a.records]  # fmt: skip

        dm_lid = world.user.query_ca_by_guid(world.iou_guid).ports[0].lid
        assert lids(ENHANCED_COMP_MASK) == [dm_lid]  # bitwise: the DM port, whatever else it has
        assert lids(0) == []  # equality: no port has exactly that one bit
    finally:
        port.close()


def test_iocs_exported_on_one_ca_are_found_and_raised_as_pnp_events(world: World) -> None:
    ious, iocs = Events(), Events()
    world.user.reg_pnp(PnpClass.IOU, ious)
    world.user.reg_pnp(PnpClass.IOC, iocs)
    owner_a, owner_b = object(), object()
    slot_a = world.unit.take_slot(owner_a, exported(0xA1, [("alpha", 0x10), ("beta", 0x11),
                                                           ("gamma", 0x12), ("delta", 0x13),
                                                           ("eps", 0x14)]))  # fmt: skip
    slot_b = world.unit.take_slot(owner_b, exported(0xB2, [], name="plain"))
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=2)
    world.quiet(disc)
    live_u, live_c = ious.take(), iocs.take()
    assert live_u == [("REG_COMPLETE", 0, 0), ("IOU_ADD", world.iou_guid, 0)]
    assert live_c[0] == ("REG_COMPLETE", 0, 0)
    # Live: each IOC added before any of its paths, every path once, nothing removed.
    for guid in (0xA1, 0xB2):
        mine = [(e, p) for e, g, p in live_c if g == guid]
        assert mine[0] == ("IOC_ADD", 0) and sorted(mine[1:]) == [
            ("IOC_PATH_ADD", p) for p in sorted(world.ports)]  # fmt: skip
    world.quiet(disc)  # nothing changed: nothing raised
    assert (ious.take(), iocs.take()) == ([], [])

    # What was raised: checked on the registry and through a new registration's replay.
    replay_u, replay_c = Events(), Events()
    other = world.mgr.open_al()
    other.reg_pnp(PnpClass.IOU | PnpClass.FLAG_REG_SYNC, replay_u)
    other.reg_pnp(PnpClass.IOC | PnpClass.FLAG_REG_SYNC, replay_c)
    assert [e for e, _, _ in replay_u.take()] == ["IOU_ADD", "REG_COMPLETE"]
    iou = replay_u.recs[0].iou
    assert iou is not None and iou.guid == world.iou_guid and iou.desc == "host1"
    log = replay_c.take()
    adds = [(e, g) for e, g, _ in log if e == "IOC_ADD"]
    assert adds == [("IOC_ADD", 0xA1), ("IOC_ADD", 0xB2)]
    paths = {(g, p) for e, g, p in log if e == "IOC_PATH_ADD"}
    assert paths == {(g, p) for g in (0xA1, 0xB2) for p in world.ports}  # found from every port
    a = next(r.ioc for r in replay_c.recs if r.event is PnpEvent.IOC_ADD and r.guid == 0xA1)
    assert isinstance(a, IocInfo) and (a.slot, a.iou_guid) == (slot_a, world.iou_guid)
    assert a.svc_entries == (SvcEntry("alpha", 0x10), SvcEntry("beta", 0x11),
                             SvcEntry("gamma", 0x12), SvcEntry("delta", 0x13),
                             SvcEntry("eps", 0x14))  # fmt: skip
    assert a.profile.protocol == 0x108 and a.profile.num_svc_entries == 5
    path_rec = next(r for r in replay_c.recs
                    if r.event is PnpEvent.IOC_PATH_ADD and r.port_guid == world.ports[2])
    assert path_rec.path is not None and len(path_rec.path) == 64
    pr = sa.PATH_RECORD.decode(path_rec.path)
    dm_port = world.user.query_ca_by_guid(world.iou_guid).ports[0]
    me = world.user.query_ca_by_guid(path_rec.ca_guid).ports[0]
    assert (pr["dlid"], pr["slid"]) == (dm_port.lid, me.lid)
    assert path_rec.ca_guid != world.iou_guid  # from another CA's port

    # An IOC destroyed: on the next sweep its paths go, then the IOC (the other stays).
    world.unit.free_slot(slot_b, owner_b)
    world.quiet(disc)
    log = iocs.take()
    assert [(e, g) for e, g, _ in log] == [("IOC_PATH_REMOVE", 0xB2)] * 3 + [("IOC_REMOVE", 0xB2)]
    assert ious.take() == []
    assert [i.ioc_guid for i in world.mgr.io_devices.iocs()] == [0xA1]

    # The last IOC gone: the port stops advertising device management, the unit goes.
    world.unit.free_slot(slot_a, owner_a)
    world.quiet(disc)
    assert [(e, g) for e, g, _ in iocs.take()] == \
        [("IOC_PATH_REMOVE", 0xA1)] * 3 + [("IOC_REMOVE", 0xA1)]  # fmt: skip
    assert ious.take() == [("IOU_REMOVE", world.iou_guid, 0)]
    assert world.mgr.io_devices.ious() == []
    assert disc.stats["sweeps"] >= 4 and disc.last_stats["malformed"] == 0


def test_periodic_sweeps_follow_the_clock(world: World) -> None:
    iocs = Events()
    world.user.reg_pnp(PnpClass.IOC, iocs)
    disc = Discovery.start(world.mgr, interval=30.0, timeout=0.5, retries=1)
    world.quiet(disc)
    assert iocs.take() == [("REG_COMPLETE", 0, 0)]
    world.unit.take_slot(object(), exported(0xC3, [("svc", 1)]))
    world.clock.advance(29.0, settle=world.settle)
    assert iocs.take() == []  # not yet
    for _ in range(40):
        world.clock.advance(0.1, settle=world.settle)
    log = iocs.take()
    assert log[0] == ("IOC_ADD", 0xC3, 0) and len(log) == 1 + len(world.ports)


def test_a_local_port_going_down_takes_its_paths_at_once(world: World) -> None:
    iocs = Events()
    world.user.reg_pnp(PnpClass.IOC, iocs)
    world.unit.take_slot(object(), exported(0xD4, [("svc", 1)]))
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    world.quiet(disc)
    assert sorted(p for e, _, p in iocs.take() if e == "IOC_PATH_ADD") == sorted(world.ports)
    leaving = world.ports[2]
    world.fabric.set_link(world.fabric.cas[2].ports[0], up=False)
    world.settle()  # no clock step, no sweep answered yet: the PORT_DOWN alone did it
    assert iocs.take() == [("IOC_PATH_REMOVE", 0xD4, leaving)]
    assert all(p.port_guid != leaving for p in disc.found.paths[0xD4])
    world.quiet(disc)  # the sweep after it agrees
    assert iocs.take() == []
    world.fabric.set_link(world.fabric.cas[2].ports[0], up=True)
    world.settle()
    world.quiet(disc)
    assert iocs.take() == [("IOC_PATH_ADD", 0xD4, leaving)]


def test_an_sa_that_does_not_answer_removes_nothing(world: World) -> None:
    iocs = Events()
    world.user.reg_pnp(PnpClass.IOC, iocs)
    world.unit.take_slot(object(), exported(0xF6, [("svc", 1)]))
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    world.quiet(disc)
    assert ("IOC_ADD", 0xF6, 0) in iocs.take()
    before = disc.found
    world.fabric.sa.enabled = False  # the SM's SA goes silent: every listing times out
    world.quiet(disc)
    assert iocs.take() == [] and disc.found == before
    assert disc.stats["sa_failed"] >= len(world.ports)
    world.fabric.sa.enabled = True
    world.quiet(disc)
    assert iocs.take() == [] and disc.found == before


def test_start_is_once_per_manager_and_close_keeps_what_was_reported(world: World) -> None:
    world.unit.take_slot(object(), exported(0x99, []))
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    assert Discovery.start(world.mgr) is disc and Discovery.of(world.mgr) is disc
    world.quiet(disc)
    disc.close()
    assert Discovery.of(world.mgr) is None
    with pytest.raises(InvalidState):
        disc.sweep_now()
    assert [i.ioc_guid for i in world.mgr.io_devices.iocs()] == [0x99]
    with pytest.raises(InvalidParameter):
        Discovery.start(world.mgr, interval=0)


def test_the_dm_mads_on_the_wire_decode_in_tshark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's Gets and the agent's GetResps as tshark reads them from the fabric's
    capture: class 0x06 version 1, the attributes and modifiers asked, clean frames."""
    if tshark_path() is None:
        if os.environ.get("IBAL_LAB_REQUIRED") == "1":
            pytest.fail("tshark not installed (Debian package tshark)")
        pytest.skip("tshark not installed (Debian package tshark)")
    monkeypatch.setenv("IBAL_CAPTURE", str(tmp_path / "dm.pcap"))
    gen = make_world()
    world = next(gen)
    try:
        world.unit.take_slot(object(), exported(0xAB, [(f"s{i}", i) for i in range(5)]))
        disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
        world.quiet(disc)
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)
        close_captures()
    fields = ["infiniband.mad.mgmtclass", "infiniband.mad.classversion", "infiniband.mad.method",
              "infiniband.mad.status", "infiniband.mad.attributeid",
              "infiniband.mad.attributemodifier", "_ws.malformed", "_ws.expert.message"]
    argv = ["tshark", "-n", "-r", str(tmp_path / "dm-ib.pcap"), "-o", WIRESHARK_IB_PREF,
            "-Y", "infiniband.mad.mgmtclass == 0x06", "-T", "fields", "-E", "separator=\t"]
    for f in fields:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert rows and all(len(x) == len(fields) for x in rows)
    assert all(x[6:] == ["", ""] for x in rows), rows  # nothing malformed, no expert info
    gets = {(int(x[4], 0), int(x[5], 0)) for x in rows if int(x[2], 0) == 0x01}
    resps = {(int(x[4], 0), int(x[5], 0)) for x in rows
             if int(x[2], 0) == 0x81 and int(x[3], 0) == 0}  # fmt: skip
    assert {x[0] for x in rows} == {"0x06"} and {int(x[1], 0) for x in rows} == {1}
    slot = disc.found.iocs[0xAB].slot
    want = {(0x10, 0), (0x11, slot), (0x12, slot << 16 | 3 << 8), (0x12, slot << 16 | 4 << 8 | 4)}
    assert gets == want and resps == want  # each asked and answered
    # One IOU is asked through one of its three ways, no try repeated; after the first
    # sweep its ChangeID is the same, so each later sweep asks IOUnitInfo only.
    assert sum(1 for x in rows if int(x[2], 0) == 0x01) == len(want) + disc.stats["sweeps"] - 1


def test_a_ca_plugged_in_and_out_gains_and_loses_its_paths(world: World) -> None:
    iocs = Events()
    world.user.reg_pnp(PnpClass.IOC, iocs)
    world.unit.take_slot(object(), exported(0xE7, []))
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    world.quiet(disc)
    iocs.take()
    ca = world.fabric.hotplug_add("late")
    world.settle()
    world.quiet(disc)
    [new_port] = [p.port_guid for p in world.user.query_ca_by_guid(ca.guid).ports]
    assert iocs.take() == [("IOC_PATH_ADD", 0xE7, new_port)]
    assert new_port in {p.port_guid for p in disc.ports}
    world.fabric.hotplug_remove(ca)
    world.settle()
    world.quiet(disc)
    assert iocs.take() == [("IOC_PATH_REMOVE", 0xE7, new_port)]
    assert new_port not in {p.port_guid for p in disc.ports}  # its requester went with it
    assert {p for _, p, _ in world.mgr.io_devices.ioc_paths(0xE7)} == set(world.ports)


def test_waiting_for_a_sweep_on_an_al_thread_is_refused(world: World) -> None:
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    world.quiet(disc)
    errors: list[BaseException] = []

    def on_misc() -> None:
        h = disc.sweep_now()
        try:
            h.wait(1)
        except InvalidState as exc:
            errors.append(exc)

    world.mgr.queues.misc.post(on_misc)
    world.quiet(disc)
    assert len(errors) == 1


def test_an_ioc_object_and_a_service_added_after_registration(world: World) -> None:
    """h6's IOC objects (``create_ioc``) on CA 1, found from the others; an entry added
    after ``register`` is reported (the IOC removed and added again with it)."""
    iocs = Events()
    world.user.reg_pnp(PnpClass.IOC, iocs)
    ca = world.user.open_ca(world.iou_guid)
    ioc = create_ioc(ca, IocProfile(ioc_guid=0x1234, io_class=0x100, id_string="obj"))
    ioc.add_svc_entry(SvcEntry("first", 1))
    ioc.register()
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    world.quiet(disc)
    iocs.take()
    [found] = world.mgr.io_devices.iocs()
    assert found.svc_entries == (SvcEntry("first", 1),) and found.profile.id_string == "obj"
    ioc.add_svc_entry(SvcEntry("second", 2))
    world.quiet(disc)
    log = [(e, g) for e, g, _ in iocs.take()]
    n = len(world.ports)
    assert log == [("IOC_PATH_REMOVE", 0x1234)] * n + [("IOC_REMOVE", 0x1234),
                                                        ("IOC_ADD", 0x1234)] + \
        [("IOC_PATH_ADD", 0x1234)] * n  # fmt: skip
    [found] = world.mgr.io_devices.iocs()
    assert found.svc_entries == (SvcEntry("first", 1), SvcEntry("second", 2))
    ioc.destroy()
    world.quiet(disc)
    assert [(e, g) for e, g, _ in iocs.take()][-1] == ("IOC_REMOVE", 0x1234)
    assert world.mgr.io_devices.iocs() == []
