"""ibal: an InfiniBand access layer for Python (IBAL's ``ib_al.h`` over ``ib_ci.h`` providers)."""

from typing import TYPE_CHECKING, Any

from ibal import status, types
from ibal.status import IbError, Status

if TYPE_CHECKING:
    from ibal.al import AccessLayer, AlManager, Dependent, QpCreate, open_al
    from ibal.al.connect import (
        ConnectOptions,
        Endpoint,
        RemoteEndpoint,
        connect_qp,
        endpoint,
    )

__version__ = "0.1.0"

_AL_EXPORTS = frozenset(
    {
        "AccessLayer",
        "AlManager",
        "ConnectOptions",
        "Dependent",
        "Endpoint",
        "QpCreate",
        "RemoteEndpoint",
        "connect_qp",
        "endpoint",
        "open_al",
    }
)


def __getattr__(name: str) -> Any:
    # The access layer is imported on first use, so ``import ibal`` stays light
    # (the pytest plugin and the CLI import the package before they need it).
    if name in _AL_EXPORTS:
        from ibal import al

        return getattr(al, name)
    raise AttributeError(f"module 'ibal' has no attribute {name!r}")


__all__ = [
    "AccessLayer",
    "AlManager",
    "ConnectOptions",
    "Dependent",
    "Endpoint",
    "IbError",
    "QpCreate",
    "RemoteEndpoint",
    "Status",
    "__version__",
    "connect_qp",
    "endpoint",
    "open_al",
    "status",
    "types",
]
