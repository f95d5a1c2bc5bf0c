"""Entry point of the ``rxe`` provider (``ibal.providers`` group).

Importing this module opens no socket: devices are created by
``RxeProvider.start``.  rxe is a real HCA (it speaks RoCEv2 on the network),
so it is not ``simulated``; it only has devices when they are configured
(``IBAL_RXE_DEVICES``, the config file or the ``devices`` option), so an
``open_al()`` on a host without configuration gets no rxe CA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibal.ci.hookspecs import hookimpl
from ibal.ci.provider import Provider, ProviderRegistry


def _factory(options: Mapping[str, Any]) -> Provider:
    from ibal.providers.rxe.provider import RxeProvider

    return RxeProvider(options)


@hookimpl
def ibal_register_providers(registry: ProviderRegistry) -> None:
    registry.add(
        "rxe",
        _factory,
        "userspace RoCEv2 (wire-compatible with Linux rdma_rxe) on configured devices",
    )
