"""The IB connection manager (IBA vol. 1 chapter 12): see docs/cm.md.

The Pythonic shape (:func:`connect`, :func:`listen`, :class:`Connection`) loads
on first use; IBAL's calls are in ``ibal.cm.api``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibal.cm.simple import (
        Connection,
        ConnectionRejected,
        Incoming,
        Listener,
        SidrReply,
        connect,
        connect_async,
        listen,
        resolve_service,
        resolve_service_async,
    )

_SIMPLE = frozenset({"Connection", "ConnectionRejected", "Incoming", "Listener", "SidrReply",
                     "connect", "connect_async", "listen", "resolve_service",
                     "resolve_service_async"})  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _SIMPLE:
        from ibal.cm import simple

        value = getattr(simple, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Connection", "ConnectionRejected", "Incoming", "Listener", "SidrReply", "connect",
    "connect_async", "listen", "resolve_service", "resolve_service_async",
]  # fmt: skip
