"""I/O controllers and the device-management agent (docs/dm.md).

:func:`create_ioc` makes an :class:`Ioc` on a CA handle (``ib_create_ioc``);
its service entries, registration and destruction are its methods.  The DM
agent (:class:`DmService`, one :class:`PortAgent` per port) answers the DM
class for every CA's I/O unit and sets the ports' IsDeviceManagementSupported
bit while the unit exports IOCs.  Built on the access layer's public API and
the MAD service; ``ibal.al`` does not import it.  Names load on first use, so
the sans-IO :mod:`ibal.dm.answer` imports without the access layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibal.dm.agent import DmService, PortAgent
    from ibal.dm.discovery import Discovery, SweepHandle
    from ibal.dm.ioc import Ioc, SvcEntryHandle, create_ioc
    from ibal.dm.iou import DEFAULT_MAX_CONTROLLERS, IoUnit, io_unit
    from ibal.dm.targets import RocePeer

_NAMES = {
    "DmService": "agent", "PortAgent": "agent", "Ioc": "ioc", "SvcEntryHandle": "ioc",
    "create_ioc": "ioc", "DEFAULT_MAX_CONTROLLERS": "iou", "IoUnit": "iou", "io_unit": "iou",
    "Discovery": "discovery", "SweepHandle": "discovery", "RocePeer": "targets",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ibal.dm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ibal.dm.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MAX_CONTROLLERS",
    "Discovery",
    "DmService",
    "IoUnit",
    "Ioc",
    "PortAgent",
    "RocePeer",
    "SvcEntryHandle",
    "SweepHandle",
    "create_ioc",
    "io_unit",
]
