"""Providers (drivers) and how they announce CAs: `ib_register_ca` / `ib_deregister_ca`.

A :class:`Provider` is one plugin: it finds its devices when started and
announces each as a :class:`~ibal.ci.interface.ChannelInterface` through the
:class:`CaRegistrar` the access layer hands it.  It may announce or withdraw CAs
at any time afterwards (hot-plug); the access layer turns that into PnP events.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ibal.ci.interface import ChannelInterface
from ibal.records import record


class CaRegistrar(Protocol):
    """What the access layer offers providers (`ib_register_ca` / `ib_deregister_ca`)."""

    def register_ca(self, ci: ChannelInterface) -> None:
        """Announce a CA that is ready for use.

        The access layer may call into ``ci`` before this returns.  Raises
        ``InvalidParameter`` (not a ChannelInterface), ``Unsupported`` (other
        ``version``) or ``DuplicateCa`` (GUID already registered).
        """

    def deregister_ca(self, guid: int) -> None:
        """Withdraw a CA: every resource on it is destroyed, then ``close_ca``.

        Raises ``NotFound`` for a GUID that is not registered.
        """


class Provider(abc.ABC):
    """One provider plugin instance.

    ``unavailable_reason`` is set by ``start`` when the provider found no
    device (for ``ibal devices`` and skip messages); it then registers no CA
    and nothing else breaks.
    """

    name: str = ""
    unavailable_reason: str | None = None

    @abc.abstractmethod
    def start(self, registrar: CaRegistrar) -> None:
        """Find devices and register one CA per device with ``registrar``."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Deregister every CA this provider registered and release its devices."""


ProviderFactory = Callable[[Mapping[str, Any]], Provider]
"""Makes a provider from options (e.g. a mock topology); ``{}`` means defaults."""


@record(frozen=True)
class ProviderSpec:
    """A provider as its plugin announces it.

    ``simulated``: its CAs are not hardware (an in-process fabric, a
    loopback template); the default access layer starts it only when asked
    for by name (``IBAL_PROVIDERS`` or ``open_al(providers=...)``), so a
    driver never gets a simulated CA ahead of a real one.
    """

    name: str
    factory: ProviderFactory
    description: str = ""
    simulated: bool = False


class ProviderRegistry:
    """Collects provider specs from the ``ibal_register_providers`` hook."""

    def __init__(self) -> None:
        self._specs: dict[str, ProviderSpec] = {}

    def add(
        self,
        name: str,
        factory: ProviderFactory,
        description: str = "",
        *,
        simulated: bool = False,
    ) -> None:
        """Offer a provider called ``name``; a later plugin may not reuse the name.

        ``simulated=True`` makes it opt-in (see :class:`ProviderSpec`).
        """
        if name in self._specs:
            raise ValueError(f"provider {name!r} registered twice")
        self._specs[name] = ProviderSpec(name, factory, description, bool(simulated))

    def get(self, name: str) -> ProviderSpec | None:
        return self._specs.get(name)

    def specs(self) -> list[ProviderSpec]:
        return list(self._specs.values())
