"""PnP of I/O units and controllers: the registry (mgr.io_devices), replay, order, reject_ioc."""

from __future__ import annotations

from typing import Any

import pytest
from al_fakes import FakeCi

from ibal.al import AccessLayer, AlManager, PnpClass, PnpEvent, PnpOrder, PnpRec
from ibal.status import InvalidHandle, InvalidParameter, NotFound
from ibal.types import Gid, IocInfo, IocProfile, IouInfo, LinkState, SvcEntry

WAIT = 10.0
E = PnpEvent
SYNC = PnpClass.FLAG_REG_SYNC

IOU = IouInfo(guid=0x100, ca_guid=0xCA, chassis_guid=0xC0, slot=3, vend_id=0x1234, dev_id=7,
              revision=2, desc="disk shelf")
SVC = (SvcEntry("SRP.T10:0001", 0x0002C90200000001), SvcEntry("other", 2))


def ioc(guid: int, iou: int = 0x100, slot: int = 1, svc: tuple[SvcEntry, ...] = SVC) -> IocInfo:
    return IocInfo(profile=IocProfile(ioc_guid=guid, io_class=0x100, num_svc_entries=len(svc),
                                      id_string=f"ioc {guid:x}"),
                   iou_guid=iou, chassis_guid=0xC0, slot=slot, svc_entries=svc)


def path(dgid_low: int, slid: int = 1) -> bytes:
    rec = bytearray(64)
    rec[8:24] = Gid(f"fe80::{dgid_low:x}").packed
    rec[24:40] = Gid("fe80::1").packed
    rec[42:44] = slid.to_bytes(2, "big")
    return bytes(rec)


def _sync(mgr: AlManager) -> None:
    assert mgr.queues.flush(WAIT)


class Log:
    def __init__(self) -> None:
        self.recs: list[tuple[str, PnpRec]] = []
        self.seen_ctx: list[Any] = []  # rec.context as the callback found it

    def cb(self, tag: str, store: Any = None, result: Any = None) -> Any:
        def fn(rec: PnpRec) -> Any:
            self.recs.append((tag, rec))
            self.seen_ctx.append(rec.context)
            if store is not None:
                rec.context = store
            return result

        return fn

    def events(self) -> list[tuple[str, PnpEvent, int]]:
        return [(t, r.event, r.guid) for t, r in self.recs]


def test_records_validate_their_fields() -> None:
    with pytest.raises(InvalidParameter):
        SvcEntry("x" * 41, 1)
    with pytest.raises(InvalidParameter):
        SvcEntry("x", 1 << 64)
    with pytest.raises(InvalidParameter):
        IocProfile(ioc_guid=1, vend_id=1 << 24)
    with pytest.raises(InvalidParameter):
        IocProfile(ioc_guid=1, id_string="é" * 33)  # 66 bytes of UTF-8
    with pytest.raises(InvalidParameter):
        IouInfo(guid=1, slot=256)
    with pytest.raises(InvalidParameter):
        IocInfo(profile=IocProfile(ioc_guid=1), svc_entries=[SvcEntry("a", 1)])  # type: ignore[arg-type]
    assert ioc(5).ioc_guid == 5
    assert SvcEntry("x" * 40, (1 << 64) - 1).name == "x" * 40


def test_replay_then_live_add_and_remove_in_hierarchy_order(mgr: AlManager,
                                                            al: AccessLayer) -> None:
    dev = mgr.io_devices
    dev.add_iou(IOU)
    dev.add_ioc(ioc(0x201))
    dev.add_ioc_path(0x201, 0xCA, 0xCA1, path(0x100))
    log = Log()
    al.reg_pnp(PnpClass.IOU | SYNC, log.cb("u"))
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("c"))
    assert log.events() == [("u", E.IOU_ADD, 0x100), ("u", E.REG_COMPLETE, 0),
                            ("c", E.IOC_ADD, 0x201), ("c", E.IOC_PATH_ADD, 0x201),
                            ("c", E.REG_COMPLETE, 0)]
    iou_rec, ioc_rec, path_rec = log.recs[0][1], log.recs[2][1], log.recs[3][1]
    assert (iou_rec.iou, iou_rec.ca_guid) == (IOU, 0xCA)
    assert ioc_rec.ioc == ioc(0x201) and ioc_rec.ca_guid == 0xCA
    assert ioc_rec.ioc.svc_entries == SVC
    assert (path_rec.ca_guid, path_rec.port_guid, path_rec.path) == (0xCA, 0xCA1, path(0x100))
    log.recs.clear()
    dev.add_ioc(ioc(0x202, slot=2))
    dev.add_ioc_path(0x202, 0xCA, 0xCA1, path(0x100))
    dev.remove_iou(0x100)  # paths, then IOCs (last added first), then the IOU
    _sync(mgr)
    assert log.events() == [
        ("c", E.IOC_ADD, 0x202), ("c", E.IOC_PATH_ADD, 0x202),
        ("c", E.IOC_PATH_REMOVE, 0x202), ("c", E.IOC_REMOVE, 0x202),
        ("c", E.IOC_PATH_REMOVE, 0x201), ("c", E.IOC_REMOVE, 0x201),
        ("u", E.IOU_REMOVE, 0x100),
    ]
    assert dev.ious() == [] and dev.iocs() == []


def test_add_in_order_remove_in_reverse_with_subsystem_order(mgr: AlManager,
                                                             al: AccessLayer) -> None:
    log = Log()
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("user1"))
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("dm"), order=PnpOrder.DM)
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("user2"))
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("mad"), order=PnpOrder.MAD)
    log.recs.clear()
    mgr.io_devices.add_iou(IOU)
    mgr.io_devices.add_ioc(ioc(0x201))
    mgr.io_devices.remove_ioc(0x201)
    _sync(mgr)
    assert [(t, e) for t, e, _ in log.events()] == [
        ("mad", E.IOC_ADD), ("dm", E.IOC_ADD), ("user1", E.IOC_ADD), ("user2", E.IOC_ADD),
        ("user2", E.IOC_REMOVE), ("user1", E.IOC_REMOVE), ("dm", E.IOC_REMOVE),
        ("mad", E.IOC_REMOVE),
    ]


def test_subsystem_order_applies_to_ca_events(mgr: AlManager, al: AccessLayer) -> None:
    log = Log()
    al.reg_pnp(PnpClass.CA | SYNC, log.cb("user"))
    al.reg_pnp(PnpClass.CA | SYNC, log.cb("sa"), order=PnpOrder.SA)
    log.recs.clear()
    hot = FakeCi(0x5000, "hot", ports=1)
    mgr.register_ca(hot)
    mgr.deregister_ca(hot.guid)
    _sync(mgr)
    assert [(t, e) for t, e, _ in log.events()] == [
        ("sa", E.CA_ADD), ("user", E.CA_ADD), ("user", E.CA_REMOVE), ("sa", E.CA_REMOVE)]


def test_order_must_be_a_pnp_order(al: AccessLayer) -> None:
    with pytest.raises(InvalidParameter):
        al.reg_pnp(PnpClass.CA, lambda rec: None, order=5)  # type: ignore[arg-type]


def test_context_is_kept_across_path_events(mgr: AlManager, al: AccessLayer) -> None:
    log = Log()
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("c", store="drv"))
    dev = mgr.io_devices
    dev.add_iou(IOU)
    dev.add_ioc(ioc(0x201))
    dev.add_ioc_path(0x201, 0xCA, 0xCA1, path(0x100))
    dev.add_ioc_path(0x201, 0xCA, 0xCA2, path(0x100, slid=2))
    dev.remove_ioc_path(0x201, 0xCA1, Gid("fe80::100"))
    dev.remove_ioc(0x201)
    _sync(mgr)
    pairs = zip(log.recs, log.seen_ctx, strict=True)
    seen = [(r.event, ctx, r.port_guid) for (_, r), ctx in pairs][1:]
    assert seen == [(E.IOC_ADD, None, 0), (E.IOC_PATH_ADD, "drv", 0xCA1),
                    (E.IOC_PATH_ADD, "drv", 0xCA2), (E.IOC_PATH_REMOVE, "drv", 0xCA1),
                    (E.IOC_PATH_REMOVE, "drv", 0xCA2), (E.IOC_REMOVE, "drv", 0)]


def test_same_record_twice_is_quiet_changed_ioc_is_readded(mgr: AlManager,
                                                          al: AccessLayer) -> None:
    log = Log()
    al.reg_pnp(PnpClass.IOC | SYNC, log.cb("c"))
    dev = mgr.io_devices
    dev.add_iou(IOU)
    dev.add_iou(IOU)
    dev.add_ioc(ioc(0x201))
    dev.add_ioc_path(0x201, 0xCA, 0xCA1, path(0x100))
    dev.add_ioc(ioc(0x201))
    dev.add_ioc_path(0x201, 0xCA, 0xCA1, path(0x100))
    _sync(mgr)
    assert len(log.recs) == 3
    dev.add_ioc(ioc(0x201, svc=SVC[:1]))  # new service entries: a new controller
    _sync(mgr)
    assert [e for _, e, _ in log.events()[3:]] == [
        E.IOC_PATH_REMOVE, E.IOC_REMOVE, E.IOC_ADD, E.IOC_PATH_ADD]
    assert log.recs[-2][1].ioc == ioc(0x201, svc=SVC[:1])
    assert dev.ioc_paths(0x201) == [(0xCA, 0xCA1, path(0x100))]


def test_hierarchy_and_bad_input_are_refused(mgr: AlManager) -> None:
    dev = mgr.io_devices
    with pytest.raises(NotFound):
        dev.add_ioc(ioc(0x201))  # no IOU
    dev.add_iou(IOU)
    with pytest.raises(NotFound):
        dev.add_ioc_path(0x201, 0xCA, 0xCA1, path(1))  # no IOC
    dev.add_ioc(ioc(0x201))
    with pytest.raises(InvalidParameter):
        dev.add_ioc_path(0x201, 0xCA, 0xCA1, b"short")
    with pytest.raises(InvalidParameter):
        dev.add_iou("iou")  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        dev.remove_ioc_path(0x201, 0xCA1, Gid("fe80::1"))
    with pytest.raises(InvalidParameter):
        dev.remove_ioc_path(0x201, 0xCA1, b"x")
    with pytest.raises(NotFound):
        dev.remove_ioc(0x999)
    with pytest.raises(NotFound):
        dev.remove_iou(0x999)


def test_reject_ioc_inside_ioc_add(mgr: AlManager) -> None:
    al1, al2 = mgr.open_al(), mgr.open_al()
    rejected: list[tuple[int, Any]] = []
    mgr.io_devices.on_reject(lambda guid, al: rejected.append((guid, al)))
    log = Log()
    errors: list[Exception] = []

    def rejecter(rec: PnpRec) -> None:
        log.recs.append(("r", rec))
        if rec.event is E.IOC_ADD and not rejected:
            try:
                al2.reject_ioc(rec)  # another AL's record
            except InvalidHandle as exc:
                errors.append(exc)
            al1.reject_ioc(rec)

    al1.reg_pnp(PnpClass.IOC | SYNC, rejecter)
    al1.reg_pnp(PnpClass.IOC | SYNC, log.cb("same-al"))
    al2.reg_pnp(PnpClass.IOC | SYNC, log.cb("other-al"))
    dev = mgr.io_devices
    dev.add_iou(IOU)
    dev.add_ioc(ioc(0x201))
    dev.add_ioc_path(0x201, 0xCA, 0xCA1, path(0x100))
    _sync(mgr)
    assert len(errors) == 1 and rejected == [(0x201, al1)]
    late = Log()
    al1.reg_pnp(PnpClass.IOC | SYNC, late.cb("late-same-al"))  # its AL rejected it: not replayed
    dev.remove_ioc(0x201)
    _sync(mgr)
    assert [(t, e) for t, e, _ in log.events()] == [
        ("r", E.REG_COMPLETE), ("same-al", E.REG_COMPLETE), ("other-al", E.REG_COMPLETE),
        ("r", E.IOC_ADD),  # the rejecter; its AL's other registration never sees the IOC
        ("other-al", E.IOC_ADD), ("other-al", E.IOC_PATH_ADD),
        ("other-al", E.IOC_PATH_REMOVE), ("other-al", E.IOC_REMOVE),
    ]
    assert late.events() == [("late-same-al", E.REG_COMPLETE, 0)]
    log.recs.clear()
    dev.add_ioc(ioc(0x201))  # it came back: a new assignment, seen again
    _sync(mgr)
    assert [t for t, _, _ in log.events()] == ["r", "same-al", "other-al"]
    al1.close()
    al2.close()


def test_reject_ioc_outside_its_callback_is_refused(mgr: AlManager, al: AccessLayer) -> None:
    recs: list[PnpRec] = []
    al.reg_pnp(PnpClass.IOC | SYNC, recs.append)
    mgr.io_devices.add_iou(IOU)
    mgr.io_devices.add_ioc(ioc(0x201))
    _sync(mgr)
    with pytest.raises(InvalidHandle):
        al.reject_ioc(recs[-1])  # the callback returned
    with pytest.raises(InvalidHandle):
        al.reject_ioc(recs[0])  # REG_COMPLETE, not an IOC_ADD
    with pytest.raises(InvalidParameter):
        al.reject_ioc("ioc")  # type: ignore[arg-type]


def test_port_down_and_ca_removal_take_what_was_reached_through_them(
        mgr: AlManager, al: AccessLayer) -> None:
    hot = FakeCi(0x5000, "hot", ports=2)
    mgr.register_ca(hot)
    p1, p2 = hot.guid + 1, hot.guid + 2
    log = Log()
    for cls, tag in ((PnpClass.CA, "ca"), (PnpClass.PORT, "port"), (PnpClass.IOU, "iou"),
                     (PnpClass.IOC, "ioc")):
        al.reg_pnp(cls | SYNC, log.cb(tag))
    dev = mgr.io_devices
    dev.add_iou(IouInfo(guid=0x100, ca_guid=hot.guid))
    dev.add_ioc(ioc(0x201))
    dev.add_ioc(ioc(0x202, slot=2))
    dev.add_ioc_path(0x201, hot.guid, p1, path(0x100))
    dev.add_ioc_path(0x202, hot.guid, p1, path(0x100))
    dev.add_ioc_path(0x202, hot.guid, p2, path(0x100))
    _sync(mgr)
    log.recs.clear()
    hot.set_port_state(1, LinkState.DOWN)
    _sync(mgr)
    _sync(mgr)
    assert [(t, e, r.port_guid or r.guid) for t, r in log.recs for e in [r.event]] == [
        ("ioc", E.IOC_PATH_REMOVE, p1), ("ioc", E.IOC_REMOVE, 0x201),  # its only path
        ("ioc", E.IOC_PATH_REMOVE, p1),  # 0x202 is still reached through port 2
        ("port", E.PORT_DOWN, p1),
    ]
    log.recs.clear()
    mgr.deregister_ca(hot.guid)
    assert [(t, e) for t, e, _ in log.events()] == [
        ("ioc", E.IOC_PATH_REMOVE), ("ioc", E.IOC_REMOVE), ("iou", E.IOU_REMOVE),
        ("port", E.PORT_REMOVE), ("port", E.PORT_REMOVE), ("ca", E.CA_REMOVE),
    ]
    assert dev.ious() == [] and dev.iocs() == []


def test_ib_reject_ioc_spelling(mgr: AlManager, al: AccessLayer) -> None:
    from ibal.compat import ib_reject_ioc

    seen: list[PnpEvent] = []

    def cb(rec: PnpRec) -> None:
        seen.append(rec.event)
        if rec.event is E.IOC_ADD:
            ib_reject_ioc(al, rec)

    al.reg_pnp(PnpClass.IOC | SYNC, cb)
    mgr.io_devices.add_iou(IOU)
    mgr.io_devices.add_ioc(ioc(0x201))
    mgr.io_devices.add_ioc_path(0x201, 0xCA, 0xCA1, path(0x100))
    mgr.io_devices.remove_iou(0x100)
    _sync(mgr)
    assert seen == [E.REG_COMPLETE, E.IOC_ADD]
