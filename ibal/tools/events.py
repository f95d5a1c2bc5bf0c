"""``ibal events``: PnP events as they happen, one line each, in the manner of ``udevadm monitor``.

:class:`EventMonitor` registers for the chosen classes on an AL and hands each
event, formatted by :func:`format_event`, to an output function; the command
runs it until SIGINT or SIGTERM.  Without ``replay`` the current state (what
a registration is first told) is left out and only changes are printed.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable, Iterable, Sequence

from ibal.al import AccessLayer, PnpClass, PnpEvent, PnpRec, PnpRegistration
from ibal.status import IbError

CLASSES: dict[str, PnpClass] = {
    "ca": PnpClass.CA, "port": PnpClass.PORT, "iou": PnpClass.IOU, "ioc": PnpClass.IOC,
}  # fmt: skip
"""``--class`` names."""


class EventsError(Exception):
    """A bad ``--class`` list: message, exit status 1."""


def parse_classes(text: str) -> list[PnpClass]:
    """``"ca,port"`` → the classes, in the order of :data:`CLASSES`; ``EventsError`` for others."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CLASSES]
    if bad or not names:
        raise EventsError(f"unknown class {', '.join(bad) or repr(text)}: "
                          f"choose from {', '.join(CLASSES)}")
    return [c for n, c in CLASSES.items() if n in names]


def _now() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S.%f")


def format_event(rec: PnpRec, pnp_class: PnpClass, stamp: str) -> str:
    """One line: time, class, event, then the device (GUIDs, port number, state and LID)."""
    cls = (pnp_class.name or "").lower()
    head = f"[{stamp}] {cls:<4} {rec.event.name:<21}"
    if rec.event is PnpEvent.REG_COMPLETE:
        return f"{head} (current state reported)"
    if pnp_class is PnpClass.CA:
        ports = f" ports {rec.ca_attr.num_ports}" if rec.ca_attr is not None else ""
        return f"{head} ca 0x{rec.ca_guid:016x}{ports}"
    if pnp_class is PnpClass.PORT:
        text = f"{head} ca 0x{rec.ca_guid:016x} port 0x{rec.guid:016x}"
        p = rec.port_attr
        if p is not None:
            text += f" {p.port_num} {p.link_state.name} lid 0x{p.lid:x}"
            if rec.event is PnpEvent.SM_CHANGE:
                text += f" sm 0x{p.sm_lid:x}"
        return text
    if pnp_class is PnpClass.IOU:
        text = f"{head} iou 0x{rec.guid:016x} ca 0x{rec.ca_guid:016x}"
        if rec.iou is not None:
            text += f" slot {rec.iou.slot} {rec.iou.desc!r}"
        return text
    text = f"{head} ioc 0x{rec.guid:016x} ca 0x{rec.ca_guid:016x}"
    if rec.path is not None:
        from ipaddress import IPv6Address

        text += f" port 0x{rec.port_guid:016x} dgid {IPv6Address(rec.path[8:24])}"
    elif rec.ioc is not None:
        text += f" {rec.ioc.profile.id_string!r} services {len(rec.ioc.svc_entries)}"
    return text


class EventMonitor:
    """PnP registrations for ``classes`` on ``al``; each event becomes one line for ``out``.

    ``out`` runs on the AL's PnP thread, one line at a time.  ``stamp`` gives
    the time column (a test passes a fixed one).
    """

    def __init__(
        self,
        al: AccessLayer,
        classes: Iterable[PnpClass],
        out: Callable[[str], object],
        *,
        replay: bool = False,
        stamp: Callable[[], str] = _now,
    ) -> None:
        self.al = al
        self.classes = list(classes)
        self.replay = replay
        self._out = out
        self._stamp = stamp
        self._regs: list[PnpRegistration] = []
        self.count = 0
        """Lines written."""

    def start(self) -> None:
        """Register; returns once the current state was reported (or left out)."""
        for cls in self.classes:
            live = threading.Event()
            if self.replay:
                live.set()
            self._regs.append(self.al.reg_pnp(cls | PnpClass.FLAG_REG_SYNC,
                                              self._callback(cls, live)))

    def _callback(self, cls: PnpClass, live: threading.Event) -> Callable[[PnpRec], None]:
        def on_event(rec: PnpRec) -> None:
            if rec.event is PnpEvent.REG_COMPLETE and not live.is_set():
                live.set()
                return
            if live.is_set():
                self.count += 1
                self._out(format_event(rec, cls, self._stamp()))

        return on_event

    def stop(self) -> None:
        """Deregister (a fence: no line is written after it returns)."""
        regs, self._regs = self._regs, []
        for reg in regs:
            with contextlib.suppress(IbError):  # the AL closed first
                reg.dereg()


def monitor(al: AccessLayer, classes: Sequence[PnpClass], replay: bool,
            out: Callable[[str], object], stop: threading.Event) -> int:
    """Print events until ``stop`` is set (the command sets it on SIGINT/SIGTERM); 0.

    IOU and IOC events come from IOC discovery, which the AL starts on the
    first IOU/IOC registration (``ibal.subsystems``; ``IBAL_SUBSYSTEMS=none``: not)."""
    mon = EventMonitor(al, classes, out, replay=replay)
    mon.start()
    try:
        stop.wait()  # interrupted by signals: their handlers set it
    finally:
        mon.stop()
    return 0


__all__ = ["CLASSES", "EventMonitor", "EventsError", "format_event", "monitor", "parse_classes"]
