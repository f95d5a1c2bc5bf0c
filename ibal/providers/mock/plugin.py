"""The mock provider's plugin module (entry point ``mock`` in ``ibal.providers``).

Importing it imports none of the mock: the default providers read its spec
(``simulated``) only to leave it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.ci.hookspecs import hookimpl
from ibal.ci.provider import Provider, ProviderRegistry


def _factory(options: Mapping[str, Any]) -> Provider:
    from ibal.providers.mock.provider import MockProvider

    return MockProvider(options)


@hookimpl
def ibal_register_providers(registry: ProviderRegistry) -> None:
    registry.add(
        "mock",
        _factory,
        "in-process fabric: RC/UC/UD, atomics, MW, SRQ, multicast, special QPs, fault injection",
        simulated=True,
    )
