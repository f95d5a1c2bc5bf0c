"""Subsystems the access layer starts when a client first registers for their PnP class.

The AL knows them only by name: each entry point of the ``ibal.subsystems``
group (read through :mod:`ibal.ci.entrypoints`, as providers are) names a
:class:`Subsystem` spec.  The built-in ones are also listed here by reference
(``"ibal.subsystems:dm_agent"``), so they are found when the installed
metadata predates the group; nothing here imports what they start.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ibal.al.pnp import PnpClass, PnpOrder
from ibal.ci import entrypoints
from ibal.status import InvalidParameter

if TYPE_CHECKING:
    from ibal.al.manager import AlManager

GROUP = "ibal.subsystems"
ENV = "IBAL_SUBSYSTEMS"
BUILTIN = {"dm_agent": "ibal.subsystems:dm_agent", "ioc_discovery": "ibal.subsystems:ioc_discovery"}
"""Fallback for the built-in entry points: name → ``module:attr``."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subsystem:
    """What starts a subsystem: before a registration for one of ``classes`` is replayed."""

    order: PnpOrder
    classes: frozenset[PnpClass]
    start: Callable[[AlManager], object]
    """Called with the manager, outside its lock, on the registering thread (may be the
    PnP thread); must be idempotent per manager; what it raises is logged and recorded."""


def parse_enabled(value: bool | str | Iterable[str] | None) -> frozenset[str] | None:
    """All (``None``): ``None`` with ``IBAL_SUBSYSTEMS`` unset, ``True``, "all";
    none: ``False``, "none", "0", "off"; else the names (a comma list)."""
    if value is None:
        value = os.environ.get(ENV)
        if value is None:
            return None
    if isinstance(value, bool):
        return None if value else frozenset()
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("", "all", "1", "on"):
            return None
        if v in ("none", "0", "off"):
            return frozenset()
        return frozenset(n.strip() for n in value.split(",") if n.strip())
    names = frozenset(value)
    if not all(isinstance(n, str) for n in names):
        raise InvalidParameter("subsystems must be a bool, a string or names")
    return names


def _load(ref: str) -> Subsystem:
    module, _, attr = ref.partition(":")
    spec = getattr(importlib.import_module(module), attr)
    if not isinstance(spec, Subsystem):
        raise TypeError(f"{ref} is not a Subsystem")
    return spec


class Subsystems:
    """One manager's subsystems: which are enabled, started, failed (``mgr.subsystems``)."""

    def __init__(self, mgr: AlManager, enabled: bool | str | Iterable[str] | None = None) -> None:
        self._mgr = mgr
        self.enabled = parse_enabled(enabled)
        """The names started (``None``: all)."""
        self._cond = threading.Condition(threading.Lock())
        self._specs: dict[str, Subsystem] | None = None  # read on first use
        self._added: dict[str, Subsystem] = {}
        self._starting: dict[str, int] = {}  # name -> thread ident
        self.started: dict[str, object] = {}
        """Name → what its start returned."""
        self.failed: dict[str, str] = {}
        """Name → why it could not be loaded or started (not tried again)."""

    def add(self, name: str, spec: Subsystem) -> None:
        """Know ``spec`` as ``name`` too (tests, embedders); replaces an entry point's."""
        if not isinstance(spec, Subsystem):
            raise InvalidParameter("spec must be a Subsystem")
        with self._cond:
            self._added[name] = spec
            if self._specs is not None:
                self._specs[name] = spec

    def _known(self) -> dict[str, Subsystem]:
        # called with the lock held; loads modules (not the subsystems themselves)
        if self._specs is None:
            refs: dict[str, str] = {}
            if self.enabled is None or self.enabled:
                try:
                    for ep in entrypoints.group(GROUP):
                        refs.setdefault(ep.name, ep.value)
                except Exception as exc:  # broken metadata: the built-ins still work
                    _log.warning("reading entry points %s: %s", GROUP, exc)
                for name, ref in BUILTIN.items():
                    refs.setdefault(name, ref)
            specs: dict[str, Subsystem] = {}
            for name, ref in refs.items():
                if self.enabled is not None and name not in self.enabled:
                    continue
                try:
                    specs[name] = _load(ref)
                except Exception as exc:
                    _log.warning("subsystem %s (%s) not loaded: %s", name, ref, exc)
                    self.failed[name] = f"load {ref}: {exc!r}"
            specs.update(self._added)
            self._specs = specs
        return self._specs

    def start_for(self, pnp_class: PnpClass) -> None:
        """Start the enabled subsystems serving ``pnp_class`` (by order), once each.

        Any thread, outside the manager's lock.  Never raises: a failure is
        logged and kept in :attr:`failed`.  A subsystem being started by
        another thread is waited for, except on the PnP thread (its start may
        need that thread) and in its own start (re-entry): there it is skipped.
        """
        me = threading.get_ident()
        on_pnp = self._mgr.queues.pnp.is_current()
        with self._cond:
            todo = sorted(
                ((n, s) for n, s in self._known().items()
                 if pnp_class in s.classes and (self.enabled is None or n in self.enabled)),
                key=lambda item: int(item[1].order),
            )  # fmt: skip
        for name, spec in todo:
            with self._cond:
                while name in self._starting and self._starting[name] != me and not on_pnp:
                    self._cond.wait()
                if name in self.started or name in self.failed or name in self._starting:
                    continue
                self._starting[name] = me
            try:
                result = spec.start(self._mgr)
            except Exception as exc:
                _log.exception("subsystem %s failed to start", name)
                with self._cond:
                    self.failed[name] = repr(exc)
            else:
                with self._cond:
                    self.started[name] = result
            finally:
                with self._cond:
                    del self._starting[name]
                    self._cond.notify_all()


__all__ = ["BUILTIN", "ENV", "GROUP", "Subsystem", "Subsystems", "parse_enabled"]
