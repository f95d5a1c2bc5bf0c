"""The ``rdma_core`` provider: rdma-core devices through Debian's pyverbs.

See docs/rdma-core-provider.md.  Importing this package does not import
pyverbs; :class:`RdmaCoreProvider` does, in ``start()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibal.providers.rdma_core.provider import RdmaCoreProvider

__all__ = ["RdmaCoreProvider", "umad"]


def __getattr__(name: str) -> Any:
    if name == "RdmaCoreProvider":
        from ibal.providers.rdma_core.provider import RdmaCoreProvider

        return RdmaCoreProvider
    if name == "umad":  # the MAD agents over libibumad, without the provider (no pyverbs)
        import importlib

        return importlib.import_module("ibal.providers.rdma_core.umad")
    raise AttributeError(name)
