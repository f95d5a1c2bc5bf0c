"""The mock provider's plugin module (entry point ``mock`` in ``ibal.providers``)."""

from __future__ import annotations

from ibal.ci.hookspecs import hookimpl
from ibal.ci.provider import ProviderRegistry
from ibal.providers.mock.provider import MockProvider


@hookimpl
def ibal_register_providers(registry: ProviderRegistry) -> None:
    registry.add(
        "mock",
        MockProvider,
        "in-process fabric: RC/UC/UD, atomics, MW, SRQ, multicast, special QPs, fault injection",
        simulated=True,
    )
