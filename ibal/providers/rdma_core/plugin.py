"""Entry point of the ``rdma_core`` provider (``ibal.providers`` group).

Importing this module imports neither pyverbs nor the provider; pyverbs is
loaded by ``RdmaCoreProvider.start``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.ci import hookimpl
from ibal.ci.provider import Provider, ProviderRegistry


def _factory(options: Mapping[str, Any]) -> Provider:
    from ibal.providers.rdma_core.provider import RdmaCoreProvider

    return RdmaCoreProvider(options)


@hookimpl
def ibal_register_providers(registry: ProviderRegistry) -> None:
    registry.add(
        "rdma_core",
        _factory,
        "rdma-core devices (HCAs, kernel soft-RoCE rxe) through Debian's pyverbs",
    )
