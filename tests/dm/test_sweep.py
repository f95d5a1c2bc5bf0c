"""The discovery sweep, sans I/O: the DM Gets it sends, what it makes of the answers, the diff.

The I/O units that answer are the DM agent's own pure function
(:func:`ibal.dm.answer.answer`) over :class:`UnitView` snapshots, so the
sweep is checked against the agent's bytes, not against itself.  Time is a
number the test advances; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ibal.dm.answer import ExportedIoc, Reply, UnitView, answer
from ibal.dm.sweep import (
    AddIoc,
    AddIou,
    AddPath,
    ArmTimer,
    Done,
    Found,
    IocPath,
    RemoveIoc,
    RemoveIou,
    RemovePath,
    Sweep,
    Target,
    Transmit,
    diff,
)
from ibal.dm.targets import RocePeer, parse_peers
from ibal.status import InvalidParameter
from ibal.types import Gid, IouInfo, SvcEntry
from ibal.wire.mad import dm
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import Method, MgmtClass

LOCAL_CA, LOCAL_PORT = 0xA0, 0xA1


def profile(guid: int, entries: int, name: str = "ctl") -> bytes:
    return dm.IO_CONTROLLER_PROFILE.encode({
        "guid": guid, "vendor_id": 0x2C9, "device_id": 0x5A44, "device_version": 3,
        "io_class": 0x100, "protocol": 0x108, "protocol_version": 1,
        "send_message_depth": 64, "rdma_read_depth": 8, "send_message_size": 4096,
        "rdma_transfer_size": 1 << 20, "controller_operations_mask": 0xFF,
        "service_entries": entries, "id_string": name.encode().ljust(64, b"\0"),
    })  # fmt: skip


def ioc(guid: int, n: int, name: str = "ctl") -> ExportedIoc:
    names = tuple((f"svc{i}".encode().ljust(40, b"\0"), guid << 8 | i) for i in range(n))
    return ExportedIoc(profile(guid, n, name), names)


def unit(*slots: ExportedIoc | None, change_id: int = 1) -> UnitView:
    return UnitView(change_id, len(slots), tuple(slots))


def dgid(n: int) -> bytes:
    return bytes.fromhex("fe800000000000000000000000000000")[:8] + n.to_bytes(8, "big")


def path(n: int) -> bytes:
    return bytes(8) + dgid(n) + bytes(40)


def target(guid: int, addr: str, port: int = LOCAL_PORT, ca: int = LOCAL_CA) -> Target:
    iou = IouInfo(guid=guid, ca_guid=ca, chassis_guid=guid + 1, vend_id=0x2C9, desc=f"node {guid}")
    return Target(iou, ca, port, addr, path(guid))


class Net:
    """Units by address; records every Get; answers unless a rule drops or replaces it."""

    def __init__(self, units: dict[str, UnitView]) -> None:
        self.units = units
        self.sent: list[tuple[str, int, int]] = []  # (addr, attr, modifier)
        self.tids: list[int] = []
        self.drop: Callable[[str, int, int, int], bool] = lambda a, attr, mod, n: False
        self.max_flight = 0

    def run(self, sweep: Sweep, now: float = 0.0, step: float = 0.5) -> tuple[Found, float]:
        """Drive ``sweep`` to its end: answers at once, the clock stepped to each timer."""
        actions = sweep.start(now)
        pending: list[bytes] = []
        seen: dict[tuple[str, int, int], int] = {}
        while True:
            due = None
            for a in actions:
                if isinstance(a, Done):
                    return a.found, now
                if isinstance(a, ArmTimer):
                    due = a.at
                elif isinstance(a, Transmit):
                    assert isinstance(a.addr, str)
                    h = H.header(a.mad)
                    assert (h.mgmt_class, h.method, h.tid) == (MgmtClass.DEV_MGT, Method.GET, a.tid)
                    key = (a.addr, h.attr_id, h.attr_mod)
                    self.sent.append(key)
                    self.tids.append(a.tid)
                    seen[key] = seen.get(key, 0) + 1
                    if a.addr in self.units and not self.drop(*key, seen[key]):
                        r = answer(a.mad, self.units[a.addr])
                        assert isinstance(r, Reply)
                        pending.append(r.mad)
            self.max_flight = max(self.max_flight, len(sweep._flight))
            if pending:
                actions = sweep.on_answer(pending.pop(0), now)
            else:
                assert due is not None, "no answer pending and no timer: the sweep is stuck"
                now = max(now, due)
                actions = sweep.on_timer(now)


def gets(net: Net) -> list[tuple[str, str, int]]:
    return [(a, dm.DmAttr(attr).name, mod) for a, attr, mod in net.sent]


def test_a_sweep_asks_unit_profiles_and_entries_in_fours() -> None:
    net = Net({"u1": unit(ioc(0x11, 6), None, ioc(0x13, 0)), "u2": unit()})
    sweep = Sweep([target(1, "u1"), target(2, "u2")])
    found, now = net.run(sweep)
    assert now == 0.0  # every answer came: no time-out waited
    SE = "SERVICE_ENTRIES"
    assert gets(net) == [
        ("u1", "IO_UNIT_INFO", 0), ("u2", "IO_UNIT_INFO", 0),
        ("u1", "IO_CONTROLLER_PROFILE", 1), ("u1", "IO_CONTROLLER_PROFILE", 3),
        ("u1", SE, 1 << 16 | 3 << 8 | 0), ("u1", SE, 1 << 16 | 5 << 8 | 4),
    ]  # fmt: skip
    assert len(set(net.tids)) == len(net.tids)
    assert list(found.ious) == [1, 2]
    assert found.ious[1].desc == "node 1" and found.ious[1].ca_guid == LOCAL_CA
    a, b = found.iocs[0x11], found.iocs[0x13]
    assert (a.slot, a.iou_guid, a.chassis_guid, b.slot) == (1, 1, 2, 3)
    assert a.profile.id_string == "ctl" and a.profile.vend_id == 0x2C9
    pa = a.profile
    assert (pa.num_svc_entries, pa.rdma_size, pa.protocol) == (6, 1 << 20, 0x108)
    assert a.svc_entries == tuple(SvcEntry(f"svc{i}", 0x11 << 8 | i) for i in range(6))
    assert b.svc_entries == ()
    assert found.paths[0x11] == (IocPath(LOCAL_CA, LOCAL_PORT, path(1)),)
    assert sweep.stats["answers"] == 6 and sweep.stats["malformed"] == 0
    assert diff(Found(), found) == [
        AddIou(found.ious[1]), AddIou(found.ious[2]),
        AddIoc(a), AddPath(0x11, found.paths[0x11][0]),
        AddIoc(b), AddPath(0x13, found.paths[0x13][0]),
    ]  # fmt: skip
    assert diff(found, found) == []


def sweep_of(units: dict[str, UnitView], targets: list[Target], previous: Found | None = None,
             **kw: object) -> tuple[Found, Sweep, Net]:  # fmt: skip
    net = Net(units)
    s = Sweep(targets, previous, **kw)  # type: ignore[arg-type]
    found, _ = net.run(s)
    return found, s, net


def test_every_diff_case() -> None:
    t1, t2 = target(1, "u1"), target(2, "u2")
    before, _, _ = sweep_of({"u1": unit(ioc(0x11, 1), ioc(0x12, 2)), "u2": unit(ioc(0x21, 0))},
                            [t1, t2])  # fmt: skip
    p1 = IocPath(LOCAL_CA, LOCAL_PORT, path(1))

    # An IOC destroyed: its slot empty, the IOC removed (the registry removes its path first).
    after, _, _ = sweep_of({"u1": unit(ioc(0x11, 1), None), "u2": unit(ioc(0x21, 0))}, [t1, t2])
    assert diff(before, after) == [RemoveIoc(0x12)]

    # A unit gone (no longer a target): one RemoveIou; the registry takes its IOCs along.
    after, _, _ = sweep_of({"u1": unit(ioc(0x11, 1), ioc(0x12, 2))}, [t1])
    assert diff(before, after) == [RemoveIou(2)]
    assert diff(after, before) == [AddIou(before.ious[2]), AddIoc(before.iocs[0x21]),
                                   AddPath(0x21, before.paths[0x21][0])]  # fmt: skip

    # A service entry added: the IOC changed, reported again (its paths stay).
    after, _, _ = sweep_of({"u1": unit(ioc(0x11, 2), ioc(0x12, 2)), "u2": unit(ioc(0x21, 0))},
                           [t1, t2])  # fmt: skip
    assert diff(before, after) == [AddIoc(after.iocs[0x11])]
    assert len(after.iocs[0x11].svc_entries) == 2

    # A second way to unit 1 (another local port): a path added to each of its IOCs.
    t1b = Target(t1.iou, LOCAL_CA, 0xA2, "u1", path(1))
    after, _, _ = sweep_of({"u1": unit(ioc(0x11, 1), ioc(0x12, 2)), "u2": unit(ioc(0x21, 0))},
                           [t1, t2, t1b])  # fmt: skip
    p1b = IocPath(LOCAL_CA, 0xA2, path(1))
    assert after.paths[0x11] == (p1, p1b)
    assert diff(before, after) == [AddPath(0x11, p1b), AddPath(0x12, p1b)]
    assert diff(after, before) == [RemovePath(0x11, 0xA2, dgid(1)), RemovePath(0x12, 0xA2, dgid(1))]

    # A new IOC in a known unit; the unit's description changed (the registry keeps it quietly).
    renamed = IouInfo(guid=2, ca_guid=LOCAL_CA, chassis_guid=3, desc="renamed")
    t2x = Target(renamed, LOCAL_CA, LOCAL_PORT, "u2", path(2))
    after, _, _ = sweep_of({"u1": unit(ioc(0x11, 1), ioc(0x12, 2)),
                            "u2": unit(ioc(0x21, 0), ioc(0x22, 5))}, [t1, t2x])  # fmt: skip
    assert diff(before, after) == [AddIou(t2x.iou), AddIoc(after.iocs[0x22]),
                                   AddPath(0x22, after.paths[0x22][0])]  # fmt: skip


def test_lost_tries_are_retried_with_new_tids_and_late_answers_are_stale() -> None:
    net = Net({"u1": unit(ioc(0x11, 1))})
    net.drop = lambda addr, attr, mod, n: attr == dm.DmAttr.IO_CONTROLLER_PROFILE and n <= 2
    s = Sweep([target(1, "u1")], timeout=0.25, retries=3)
    found, now = net.run(s)
    assert list(found.iocs) == [0x11]
    assert now == pytest.approx(0.5)  # two time-outs of 0.25 s
    profile_gets = [t for (a, attr, m), t in zip(net.sent, net.tids, strict=True)
                    if attr == dm.DmAttr.IO_CONTROLLER_PROFILE]  # fmt: skip
    assert len(profile_gets) == 3 and len(set(profile_gets)) == 3
    assert s.stats["retries"] == 2 and s.stats["timeouts"] == 0
    # The answer to a try given up arrives late: stale, nothing changes.
    late = answer(dm.dm_mad(dm.DmAttr.IO_CONTROLLER_PROFILE, profile_gets[0], modifier=1),
                  net.units["u1"])  # fmt: skip
    assert isinstance(late, Reply)
    assert s.on_answer(late.mad, now) == [] and s.stats["stale"] == 1


def test_a_unit_that_never_answers_is_absent_and_another_way_is_tried() -> None:
    net = Net({"u1": unit(ioc(0x11, 0))})
    s = Sweep([target(1, "dead"), target(2, "nowhere")], timeout=1.0, retries=2)
    found, now = net.run(s)
    assert found == Found() and now == pytest.approx(3.0)  # 1 + 2 tries of 1 s, in parallel
    assert s.stats["iou_unreachable"] == 2 and s.stats["timeouts"] == 2
    assert [a for a, _, _ in net.sent] == ["dead", "nowhere"] * 3

    # Unit 1 reached from two ports; the first way is dead, the second answers.
    t_dead = target(1, "dead")
    t_ok = Target(t_dead.iou, LOCAL_CA, 0xA2, "u1", path(1))
    net = Net({"u1": unit(ioc(0x11, 0))})
    s = Sweep([t_dead, t_ok], timeout=1.0, retries=1)
    found, now = net.run(s)
    assert list(found.iocs) == [0x11] and now == pytest.approx(2.0)
    assert [a for a, _, _ in net.sent] == ["dead", "dead", "u1", "u1"]
    assert found.paths[0x11] == (IocPath(LOCAL_CA, LOCAL_PORT, path(1)),
                                 IocPath(LOCAL_CA, 0xA2, path(1)))  # fmt: skip


def test_partial_answers_keep_what_the_last_sweep_knew() -> None:
    t1 = target(1, "u1")
    units = {"u1": unit(ioc(0x11, 1), ioc(0x12, 5))}
    before, _, _ = sweep_of(units, [t1])
    # Slot 2's second ServiceEntries MAD never answers; slot 1's profile neither.
    net = Net(units)

    def lost(addr: str, attr: int, mod: int, n: int) -> bool:
        return (attr, mod) in ((dm.DmAttr.SERVICE_ENTRIES, 2 << 16 | 4 << 8 | 4),
                               (dm.DmAttr.IO_CONTROLLER_PROFILE, 1))  # fmt: skip

    net.drop = lost
    s = Sweep([t1], before, timeout=0.5, retries=1, trust_change_id=False)
    found, _ = net.run(s)
    assert s.stats["carried_over"] == 2 and s.stats["timeouts"] == 2
    assert found == Found(before.ious, before.iocs, before.paths, before.ways)  # no ChangeID
    assert diff(before, found) == []
    # Without a previous sweep, incomplete controllers stay unreported; the unit is there.
    net = Net(units)
    net.drop = lost
    s = Sweep([t1], timeout=0.5, retries=1)
    found, _ = net.run(s)
    assert list(found.ious) == [1] and dict(found.iocs) == {}


def test_error_statuses_end_a_request_without_retry() -> None:
    # The unit lists slot 2, but the controller went before its profile was asked: NO_IOC.
    listed = unit(ioc(0x11, 0), ioc(0x12, 0))
    now_gone = unit(ioc(0x11, 0), None)
    net = Net({"u1": listed})
    s = Sweep([target(1, "u1")])
    actions = s.start(0.0)
    [first] = [a for a in actions if isinstance(a, Transmit)]
    r = answer(first.mad, listed)
    assert isinstance(r, Reply)
    actions = s.on_answer(r.mad, 0.0)
    sends = [a for a in actions if isinstance(a, Transmit)]
    assert len(sends) == 2
    for a in sends:
        r = answer(a.mad, now_gone)
        assert isinstance(r, Reply)
        actions = s.on_answer(r.mad, 0.0)
    assert s.done and s.found is not None and list(s.found.iocs) == [0x11]
    assert s.stats["error_status"] == 1 and s.stats["retries"] == 0
    assert isinstance(actions[-1], Done)
    del net


def test_malformed_answers_are_dropped_and_counted() -> None:
    u = unit(ioc(0x11, 1))
    s = Sweep([target(1, "u1")], timeout=1.0)
    [send] = [a for a in s.start(0.0) if isinstance(a, Transmit)]
    good = answer(send.mad, u)
    assert isinstance(good, Reply)
    forged = [
        good.mad[:100],                                          # short
        bytes([1, 0x04]) + good.mad[2:],                         # another class (PerfMgt)
        good.mad[:3] + bytes([Method.GET]) + good.mad[4:],       # a request, not a GetResp
        good.mad[:16] + b"\x00\x11" + good.mad[18:],             # another attribute
        good.mad[:20] + b"\x00\x00\x00\x05" + good.mad[20 + 4:],  # another modifier
        good.mad[:2] + b"\x02" + good.mad[3:],                   # another class version
    ]  # fmt: skip
    for m in forged:
        assert s.on_answer(m, 0.1) == []
    assert s.stats["malformed"] == len(forged) and not s.done
    # A profile answer with IOC GUID 0 makes no sense: malformed, the request keeps waiting.
    actions = s.on_answer(good.mad, 0.2)
    [psend] = [a for a in actions if isinstance(a, Transmit)]
    bad = bytearray(H.respond(psend.mad, data=profile(0, 1)))
    assert s.on_answer(bytes(bad), 0.3) == [] and s.stats["malformed"] == len(forged) + 1
    right = answer(psend.mad, u)
    assert isinstance(right, Reply)
    for a in s.on_answer(right.mad, 0.4):
        if isinstance(a, Transmit):
            r = answer(a.mad, u)
            assert isinstance(r, Reply)
            s.on_answer(r.mad, 0.5)
    assert s.done and s.found is not None and list(s.found.iocs) == [0x11]


def test_the_window_bounds_requests_in_flight() -> None:
    units = {f"u{i}": unit(ioc(0x100 + i, 9)) for i in range(6)}
    net = Net(units)
    s = Sweep([target(i + 1, f"u{i}") for i in range(6)], window=2)
    found, _ = net.run(s)
    assert len(found.iocs) == 6 and net.max_flight <= 2
    assert s.stats["sent"] == 6 * (1 + 1 + 3)


def test_bad_settings_and_a_second_start_are_refused() -> None:
    with pytest.raises(InvalidParameter):
        Sweep([], timeout=0)
    with pytest.raises(InvalidParameter):
        Sweep([], window=0)
    s = Sweep([])
    assert s.start(0.0)[-1] == Done(Found())
    with pytest.raises(InvalidParameter):
        s.start(0.0)


def test_without_port_and_keeping() -> None:
    t1, t2 = target(1, "u1"), target(2, "u2")
    t1b = Target(t1.iou, LOCAL_CA, 0xA2, "u1", path(1))
    found, _, _ = sweep_of({"u1": unit(ioc(0x11, 1)), "u2": unit(ioc(0x21, 0))}, [t1, t2, t1b])
    assert found.ways == {1: frozenset({LOCAL_PORT, 0xA2}), 2: frozenset({LOCAL_PORT})}
    left = found.without_port(LOCAL_PORT)
    assert list(left.ious) == [1] and list(left.iocs) == [0x11]
    assert left.paths[0x11] == (IocPath(LOCAL_CA, 0xA2, path(1)),)
    assert diff(found, left) == [RemoveIou(2), RemovePath(0x11, LOCAL_PORT, dgid(1))]
    # A sweep that could not list port 0xA2's units keeps what it reached; others go.
    empty = Found()
    assert empty.keeping(found, {0xA2}) == Found(
        {1: found.ious[1]}, {0x11: found.iocs[0x11]}, {0x11: found.paths[0x11]},
        {1: found.ways[1]}, {1: found.change_ids[1]})  # fmt: skip
    assert empty.keeping(found, {0xA9}) == empty


def test_the_gets_on_the_wire_byte_by_byte() -> None:
    """IBA 16.3.1: common header (base 1, class 0x06, version 1, Get), 40 reserved bytes,
    no data; the modifiers at bytes 20..23 (ServiceEntries: slot, last, first)."""
    u = unit(None, ioc(0x22, 6))
    s = Sweep([target(1, "u1")], tids=iter(range(0x51, 0x60)))
    [a] = [x for x in s.start(0.0) if isinstance(x, Transmit)]
    m = a.mad
    assert len(m) == 256 and m[0:4] == b"\x01\x06\x01\x01" and m[4:8] == bytes(4)
    assert m[8:16] == (0x51).to_bytes(8, "big") and m[16:18] == b"\x00\x10"
    assert m[18:20] == bytes(2) and m[20:24] == bytes(4) and m[24:256] == bytes(232)
    r = answer(m, u)
    assert isinstance(r, Reply)
    [p] = [x for x in s.on_answer(r.mad, 0.0) if isinstance(x, Transmit)]
    assert p.mad[16:18] == b"\x00\x11" and p.mad[20:24] == b"\x00\x00\x00\x02"  # slot 2
    r = answer(p.mad, u)
    assert isinstance(r, Reply)
    e1, e2 = [x for x in s.on_answer(r.mad, 0.0) if isinstance(x, Transmit)]
    assert e1.mad[16:18] == b"\x00\x12" and e1.mad[20:24] == b"\x00\x02\x03\x00"  # 0..3
    assert e2.mad[20:24] == b"\x00\x02\x05\x04"  # entries 4..5
    assert [x.mad[8:16] for x in (e1, e2)] == [(0x53).to_bytes(8, "big"), (0x54).to_bytes(8, "big")]


def test_an_unchanged_change_id_spares_the_profile_and_entry_gets() -> None:
    t1 = target(1, "u1")
    first, _, _ = sweep_of({"u1": unit(ioc(0x11, 6), None, ioc(0x13, 1), change_id=7)}, [t1])
    assert first.change_ids == {1: 7}
    again, s, net = sweep_of({"u1": unit(ioc(0x11, 6), None, ioc(0x13, 1), change_id=7)}, [t1],
                             first)  # fmt: skip
    assert gets(net) == [("u1", "IO_UNIT_INFO", 0)] and s.stats["unchanged_units"] == 1
    assert again == first and diff(first, again) == []
    # A new ChangeID (an entry added): asked again, the change seen.
    moved, s, net = sweep_of({"u1": unit(ioc(0x11, 7), None, ioc(0x13, 1), change_id=8)}, [t1],
                             first)  # fmt: skip
    assert len(net.sent) == 1 + 2 + 2 + 1 and s.stats["unchanged_units"] == 0
    assert diff(first, moved) == [AddIoc(moved.iocs[0x11])]
    # The same ChangeID but other slots (a peer that does not move it): asked again.
    odd, s, net = sweep_of({"u1": unit(ioc(0x11, 6), ioc(0x12, 0), ioc(0x13, 1), change_id=7)},
                           [t1], first)  # fmt: skip
    assert sorted(odd.iocs) == [0x11, 0x12, 0x13] and s.stats["unchanged_units"] == 0
    # trust_change_id=False asks everything; an incomplete read records no ChangeID.
    _, s, net = sweep_of({"u1": unit(ioc(0x11, 6), None, ioc(0x13, 1), change_id=7)}, [t1],
                         first, trust_change_id=False)  # fmt: skip
    assert len(net.sent) == 1 + 2 + 2 + 1
    n = Net({"u1": unit(ioc(0x11, 6), change_id=9)})
    n.drop = lambda a, attr, mod, k: attr == dm.DmAttr.SERVICE_ENTRIES
    part, _ = n.run(Sweep([t1], first, timeout=0.1, retries=0))
    assert part.change_ids == {}


def test_the_peers_setting() -> None:
    peers = parse_peers(" 10.0.0.7, fd00::9=disk array ,,")
    assert peers == (RocePeer(Gid("::ffff:10.0.0.7")), RocePeer(Gid("fd00::9"), desc="disk array"))
    assert parse_peers("") == ()
    with pytest.raises(InvalidParameter, match=r"IBAL_IOC_PEERS.*'host7'"):
        parse_peers("host7")


def test_odd_but_decodable_answers() -> None:
    """Two slots claiming one IOC GUID: the first kept, counted; undecodable name bytes are
    replaced (the text stays within the field's size)."""
    bad_name = ExportedIoc(profile(0x31, 1, name="x"), ((b"\xff" * 40, 5),))
    found, s, _ = sweep_of({"u1": unit(ioc(0x31, 0), ioc(0x31, 0), bad_name)}, [target(1, "u1")])
    assert list(found.iocs) == [0x31] and found.iocs[0x31].slot == 1
    assert s.stats["duplicate_ioc"] == 2 and s.stats["malformed"] == 0
    named = ExportedIoc(profile(0x32, 1, name="\u00e9t\u00e9"), ((b"\xff" * 40, 5),))
    found, _, _ = sweep_of({"u1": unit(named)}, [target(1, "u1")])
    [entry] = found.iocs[0x32].svc_entries
    assert set(entry.name) == {"\ufffd"} and len(entry.name.encode()) <= 40
    assert found.iocs[0x32].profile.id_string == "\u00e9t\u00e9"
