"""The entry point: how ibal finds this provider.

``pyproject.toml`` names this module in the ``ibal.providers`` entry-point
group.  ibal imports it only when the provider called "sample" is asked for,
then calls the hook below once.  The hook only says what the provider is
called and how to make one; looking for devices waits for ``Provider.start``.

``simulated=True``: the loopback CA is not hardware, so ``ibal.open_al()``
without arguments leaves it out unless asked for by name.  A driver for real
adapters leaves the flag at its default.
"""

from __future__ import annotations

from ibal.ci import ProviderRegistry, hookimpl

from ibal_sample_provider.provider import SampleProvider


@hookimpl
def ibal_register_providers(registry: ProviderRegistry) -> None:
    registry.add(
        "sample",
        SampleProvider,
        "a loopback HCA: the template for provider authors",
        simulated=True,
    )
