"""``AlManager``: the CAs providers registered, the AL instances over them, the callback queues.

The manager is the :class:`~ibal.ci.CaRegistrar` providers talk to
(``ib_register_ca`` / ``ib_deregister_ca``).  It opens each CA exactly once and
multiplexes every AL instance's ``Ca`` handles over that one CI instance;
upcalls are routed by :class:`~ibal.al.cica.CiCa`.  ``ibal.open_al()`` without
arguments uses a process-wide default manager whose providers start on first
use (``IBAL_PROVIDERS``, comma separated, else every installed provider that
is not simulated); providers that fail are recorded in ``unavailable``, never
raised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from ibal.al import pnp, pnp_engine
from ibal.al.access_layer import AccessLayer, hand_over_manager
from ibal.al.cica import CiCa
from ibal.al.dispatcher import CallbackQueues, log
from ibal.al.pnp import PnpRegistration
from ibal.al.pnp_io import IoDevices
from ibal.al.stash import Stash
from ibal.al.subsystems import Subsystems
from ibal.al.timer import TimerService
from ibal.ci.interface import ChannelInterface
from ibal.ci.manager import ProviderManager
from ibal.ci.provider import Provider
from ibal.clock import Clock
from ibal.status import (
    DuplicateCa,
    IbError,
    InvalidAlHandle,
    InvalidParameter,
    InvalidState,
    NotFound,
    Timeout,
    Unsupported,
)
from ibal.types import MIN_VERBS_VERSION, VERBS_VERSION, AsyncEvent, LinkState

PROVIDERS_ENV = "IBAL_PROVIDERS"

_COUNTER = itertools.count(1)


class AlManager:
    """The access layer's manager: a ``CaRegistrar`` plus the AL instances over its CAs."""

    def __init__(
        self,
        *,
        provider_manager: ProviderManager | None = None,
        clock: Clock | None = None,
        subsystems: bool | str | Iterable[str] | None = None,
    ) -> None:
        """``subsystems``: which to start on a first IOU/IOC registration (``None``: from
        ``IBAL_SUBSYSTEMS``, else all; ``False``: none; names; see :mod:`ibal.al.subsystems`)."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        n = next(_COUNTER)
        self._queues = CallbackQueues(f"ibal-{n}")
        self._dispatcher = self._queues  # the former name: its post() is misc.post
        # Expired timers run on the misc queue (TimerService.set_post moves them).
        self._timers = TimerService(self._queues.misc.post, clock, name=f"ibal-timer-{n}")
        self._cas: dict[int, CiCa] = {}  # registered, in registration order
        self._closing: dict[int, CiCa] = {}  # deregistered, close_ca still to come
        self._registering: set[int] = set()
        self._als: dict[AccessLayer, None] = {}
        self._pnp_regs: dict[PnpRegistration, None] = {}  # in registration order
        self.pnp_callback_errors = 0
        """PnP callbacks that raised (each logged with its registration and event)."""
        self.pnp_coalesced = 0
        """Port-change PnP events dropped because a newer one replaced them (slow clients)."""
        self.io_devices = IoDevices(self)
        """The IOUs, IOCs and IOC paths reported (raised as IOU / IOC PnP events)."""
        self._providers: list[Provider] = []
        self._provider_manager = provider_manager
        self._closed = False
        self.unavailable: dict[str, str] = {}
        """Providers that loaded but found no device, or failed: name → reason."""
        self.subsystems = Subsystems(self, subsystems)
        """The subsystems started before a registration for their PnP class is replayed."""
        self.stash = Stash()
        """Per-manager state of the layers above (the CM agent, each port's SA Report
        hub, the DM's I/O units...), under :class:`~ibal.al.stash.StashKey` keys they own;
        it lives as long as the manager.  Callers serialise their own updates."""

    def __repr__(self) -> str:
        return f"<AlManager {len(self._cas)} CAs, {len(self._als)} ALs>"

    def __enter__(self) -> AlManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queues(self) -> CallbackQueues:
        """The callback queues of this manager's ALs (``queues.misc.post(fn, *args)``)."""
        return self._queues

    @property
    def dispatcher(self) -> CallbackQueues:
        """The former name of :attr:`queues`."""
        return self._queues

    @property
    def timers(self) -> TimerService:
        """The manager's timer service (``al.timers`` is a per-AL scope of it)."""
        return self._timers

    @property
    def clock(self) -> Clock:
        """The clock every timer of this manager runs on (``clock=`` at construction)."""
        return self._timers.clock

    # ------------------------------------------------------------------ providers
    def _providers_pm(self) -> ProviderManager:
        if self._provider_manager is None:
            self._provider_manager = ProviderManager()
        return self._provider_manager

    def start_provider(self, name: str, options: Mapping[str, Any] | None = None) -> Provider:
        """Make provider ``name`` (entry points) with ``options`` and start it on this manager."""
        provider = self._providers_pm().create(name, dict(options or {}))
        return self.add_provider(provider)

    def add_provider(self, provider: Provider) -> Provider:
        """Start ``provider`` (an instance made by hand); it registers its CAs here."""
        if not isinstance(provider, Provider):
            raise InvalidParameter(f"{provider!r} is not a Provider")
        if self._closed:
            raise InvalidState("the manager is closed")
        try:
            provider.start(self)
        except BaseException:
            try:  # it may have registered some CAs before failing
                provider.stop()
            except Exception as exc:
                log.debug("stop after a failed start: %s", exc)
            raise
        with self._lock:
            self._providers.append(provider)
        if provider.unavailable_reason:
            self.unavailable[provider.name or type(provider).__name__] = provider.unavailable_reason
        return provider

    @property
    def providers(self) -> list[Provider]:
        return list(self._providers)

    # ------------------------------------------------------------------ CaRegistrar
    def register_ca(self, ci: ChannelInterface) -> None:
        """``ib_register_ca``: open the CA once, cache its attributes, announce it (PnP).

        ``InvalidParameter`` for a non-``ChannelInterface``, ``Unsupported`` for
        a contract ``version`` outside ``MIN_VERBS_VERSION..VERBS_VERSION``,
        ``DuplicateCa`` for a GUID already here.
        The CI is called (``open_ca``, ``query_ca``) before this returns.
        """
        if not isinstance(ci, ChannelInterface):
            raise InvalidParameter(f"{ci!r} is not a ChannelInterface")
        version = getattr(ci, "version", None)
        if type(version) is not int or not MIN_VERBS_VERSION <= version <= VERBS_VERSION:
            raise Unsupported(f"contract version {version!r}, this access layer speaks "
                              f"{MIN_VERBS_VERSION} to {VERBS_VERSION}")
        guid = getattr(ci, "guid", None)
        if not isinstance(guid, int) or isinstance(guid, bool) or guid <= 0:
            raise InvalidParameter(f"bad CA GUID {guid!r}")
        with self._lock:
            if self._closed:
                raise InvalidState("the manager is closed")
            if guid in self._cas or guid in self._registering:
                raise DuplicateCa(f"a CA with GUID 0x{guid:016x} is already registered")
            old = self._closing.get(guid)
            self._registering.add(guid)
        try:
            if old is not None and not old.closed.is_set():
                if self._queues.is_current():
                    raise DuplicateCa(f"CA 0x{guid:016x} is still being withdrawn")
                old.closed.wait()
            cica = CiCa(self, ci)
            cica.h_ca = ci.open_ca(cica.completion_cb, cica.async_event_cb, cica)
            try:
                cica.attr = ci.query_ca(cica.h_ca)
            except BaseException:
                ci.close_ca(cica.h_ca)
                raise
            with self._lock:
                self._cas[guid] = cica
                pnp_engine.ca_added(pnp.ordered(self._pnp_regs), cica)
        finally:
            with self._lock:
                self._registering.discard(guid)

    def deregister_ca(self, guid: int) -> None:
        """``ib_deregister_ca``: PnP removes, every resource on the CA destroyed, ``close_ca``.

        ``NotFound`` for an unknown GUID.  Blocks until ``close_ca`` was called,
        except on one of the manager's queue threads (from a callback), where
        the teardown completes once the callbacks holding it up returned.
        """
        with self._lock:
            cica = self._cas.pop(guid, None) if isinstance(guid, int) else None
            if cica is None:
                raise NotFound(f"no CA with GUID {guid!r} is registered")
            cica.removing = True
            self._closing[guid] = cica
            pnp_engine.ca_removed(pnp.ordered(self._pnp_regs), cica)
            # After the PnP removes were delivered: clients drop handles on CA_REMOVE.
            self._queues.pnp.post(self._teardown, cica)
        if not self._queues.is_current():
            cica.closed.wait()

    def _teardown(self, cica: CiCa) -> None:
        """PnP-queue task: destroy every AL handle on the CA (children first)."""
        with self._lock:
            cas = sorted(cica.cas, key=lambda c: -c._seq)
            close_now = not cas and not cica.closing
            if close_now:
                cica.closing = True
        for ca in cas:
            ca._destroy_forced()
        if close_now:
            self._close_cica(cica)

    def _close_cica(self, cica: CiCa) -> None:
        """The last handle on a withdrawn CA is gone: ``close_ca``."""
        try:
            cica.ci.close_ca(cica.h_ca)
        except Exception as exc:
            log.error("ibal: close_ca of %s failed: %s", cica.name, exc)
        with self._lock:
            if self._closing.get(cica.guid) is cica:
                del self._closing[cica.guid]
            cica.closed.set()
            self._cond.notify_all()

    def pnp_port_change(self, cica: CiCa, code: AsyncEvent, port_num: int) -> None:
        """Misc-queue task: a port event arrived; PnP events for what changed.

        Attributes come from a fresh ``query_ca``; the event itself says which
        port changed and, for PORT_ACTIVE/PORT_DOWN, which way: a port that
        bounced before this task ran still yields its DOWN then its ACTIVE.
        """
        try:
            new = cica.ci.query_ca(cica.h_ca)
        except Exception as exc:
            log.warning("ibal: query_ca after a port event on %s failed: %s", cica.name, exc)
            return
        with self._lock:
            if self._cas.get(cica.guid) is not cica:
                # Not announced yet (an upcall from inside open_ca: CA_ADD will carry the
                # state) or withdrawn meanwhile (its ports were already removed).
                return
            old = cica.attr
            before = {p.port_num: p for p in old.ports}
            ports = []
            for port in new.ports:
                if port_num and port.port_num != port_num:
                    port = before.get(port.port_num, port)  # its own event will come
                elif code is AsyncEvent.PORT_DOWN and port.link_state is LinkState.ACTIVE:
                    port = dataclasses.replace(port, link_state=LinkState.DOWN)
                elif code is AsyncEvent.PORT_ACTIVE and port.link_state is not LinkState.ACTIVE:
                    port = dataclasses.replace(port, link_state=LinkState.ACTIVE)
                ports.append(port)
            cica.attr = dataclasses.replace(new, ports=tuple(ports))
            regs = pnp.ordered(self._pnp_regs)
            pnp_engine.port_changes(regs, cica, old, cica.attr)
            if code is AsyncEvent.CLIENT_REREGISTER:
                pnp_engine.client_reregister(regs, cica, port_num)
            gone = {p.port_num for p in old.ports} - {p.port_num for p in cica.attr.ports}
            if gone:  # after their PORT_REMOVEs: dependents on those ports go
                self._queues.pnp.post(self._teardown_ports, cica, gone)

    def _teardown_ports(self, cica: CiCa, port_nums: set[int]) -> None:
        """PnP-queue task: destroy the dependents hung on ports that disappeared."""
        with self._lock:
            victims = [d for ca in cica.cas for d in ca._children
                       if d._dep_port in port_nums]
        for d in sorted(victims, key=lambda o: -o._seq):
            d._destroy_forced()

    @property
    def ca_guids(self) -> list[int]:
        """The registered CAs, in registration order."""
        with self._lock:
            return [c.guid for c in self.live_cas()]

    # ------------------------------------- what the other access-layer modules use
    @property
    def cond(self) -> threading.Condition:
        """The condition on the manager lock that AL objects' phase changes notify."""
        return self._cond

    def live_cas(self) -> list[CiCa]:
        """The registered CAs not being withdrawn, in registration order (take the lock)."""
        return [c for c in self._cas.values() if not c.removing]

    def find_ca(self, guid: int) -> CiCa | None:
        """Registered CA ``guid``, unless absent or being withdrawn."""
        cica = self._cas.get(guid)
        return None if cica is None or cica.removing else cica

    def forget_al(self, al: AccessLayer) -> None:
        """``al`` is closed: the manager no longer closes it."""
        self._als.pop(al, None)

    def add_pnp_reg(self, reg: PnpRegistration) -> None:
        """A PnP registration joins, after those before it (take the lock)."""
        self._pnp_regs[reg] = None

    def drop_pnp_reg(self, reg: PnpRegistration) -> None:
        self._pnp_regs.pop(reg, None)

    def pnp_regs(self) -> list[PnpRegistration]:
        """The PnP registrations, in registration order (take the lock)."""
        return list(self._pnp_regs)

    # ------------------------------------------------------------------ ALs
    def open_al(self) -> AccessLayer:
        """``ib_open_al`` on this manager's CAs."""
        with self._lock:
            if self._closed:
                raise InvalidState("the manager is closed")
            al = AccessLayer(self)
            self._als[al] = None
        al._activate(InvalidState)
        return al

    def close(self, *, timeout: float | None = None) -> None:
        """Close every AL, stop the providers (their CAs go), end the callback queues.

        Raises ``InvalidState`` inside one of this manager's callbacks (it ends
        their threads); a second call does nothing.
        """
        if self._queues.is_current():
            raise InvalidState("closing a manager from inside its own callback would deadlock")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            als = list(self._als)
        for al in als:
            with contextlib.suppress(InvalidAlHandle):  # closed meanwhile
                al._destroy(None, True, timeout)
        for provider in reversed(self._providers):
            try:
                provider.stop()
            except Exception as exc:
                log.warning("ibal: stopping provider %s failed: %s", provider.name, exc)
        for guid in list(self._cas):
            with contextlib.suppress(NotFound):
                self.deregister_ca(guid)
        with self._lock:
            if not self._cond.wait_for(lambda: not self._closing, timeout):
                raise Timeout(f"CAs still closing: {[c.name for c in self._closing.values()]}")
        self._timers.close()
        self._queues.stop()


# ---------------------------------------------------------------------- module level
_default: AlManager | None = None
_default_lock = threading.Lock()


SIMULATED_SKIPPED = "simulated: started only when named (IBAL_PROVIDERS or open_al(providers=...))"
"""The ``unavailable`` reason of a simulated provider the default set leaves out."""


def start_default_providers(mgr: AlManager, names: Sequence[str] = ()) -> None:
    """Start ``names`` on ``mgr``, else every installed provider that is not simulated.

    Without names simulated providers (``ProviderSpec.simulated``: the mock,
    the sample) are left out, so the first CA is a real device when there is
    one.  A provider that fails to load or start, and each simulated one left
    out, is recorded in ``mgr.unavailable``, never raised.
    """
    pm = mgr._providers_pm()
    chosen = list(names)
    if not chosen:
        for name in pm.names():
            try:
                spec = pm.spec(name)
            except Exception as exc:  # a broken plugin must not hide the others
                mgr.unavailable[name] = exc.detail if isinstance(exc, IbError) else str(exc)
                continue
            if spec.simulated:
                mgr.unavailable[name] = SIMULATED_SKIPPED
            else:
                chosen.append(name)
    for name in chosen:
        try:
            mgr.start_provider(name)
        except Exception as exc:  # one broken provider must not hide the others
            detail = exc.detail if isinstance(exc, IbError) else ""
            mgr.unavailable[name] = detail or str(exc)


def default_manager() -> AlManager:
    """The process-wide manager ``ibal.open_al()`` uses; providers start on first use.

    ``IBAL_PROVIDERS`` (comma separated) names them (simulated ones included);
    else every installed provider that is not simulated
    (see :func:`start_default_providers`).
    """
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            mgr = AlManager()
            env = os.environ.get(PROVIDERS_ENV, "")
            start_default_providers(mgr, [n.strip() for n in env.split(",") if n.strip()])
            _default = mgr
        return _default


def open_al(
    providers: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
    *,
    clock: Clock | None = None,
) -> AccessLayer:
    """``ib_open_al``.

    ``providers=None`` opens on the default manager; a list of names or a dict
    ``{name: options}`` opens on a private manager running only those
    providers (closing the AL closes it).  ``clock`` (e.g. an
    :class:`ibal.clock.ManualClock`, also handed to the mock as its ``clock``
    option) drives the private manager's timers; it needs ``providers``.
    """
    if providers is None:
        if clock is not None:
            raise InvalidParameter("clock= makes a private manager: name the providers too")
        return default_manager().open_al()
    items: list[tuple[str, Mapping[str, Any]]]
    given: Any = providers
    if isinstance(given, Mapping):
        items = [(str(k), {} if v is None else v) for k, v in given.items()]
        for name, options in items:
            if not isinstance(options, Mapping):
                raise InvalidParameter(f"provider {name!r}: options are a dict: {options!r:.40}")
    elif isinstance(providers, str):
        items = [(providers, {})]
    elif isinstance(given, Sequence) and not isinstance(given, (bytes, bytearray)):
        try:
            names: list[Any] = list(given)
        except ValueError:  # a released memoryview
            names = [None]
        if not all(isinstance(n, str) for n in names):
            raise InvalidParameter(f"providers is a list of names, not {providers!r:.40}")
        items = [(n, {}) for n in names]
    else:
        raise InvalidParameter("providers is None, a list of names or a dict of options")
    mgr = AlManager(clock=clock)
    try:
        for name, options in items:
            mgr.start_provider(name, options)
        al = mgr.open_al()
    except BaseException:
        mgr.close()
        raise
    hand_over_manager(al)
    return al
