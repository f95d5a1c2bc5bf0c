"""The built-in subsystems (entry points of ``ibal.subsystems``, see :mod:`ibal.al.subsystems`).

The DM agent and IOC discovery start when a client first registers for IOU or
IOC events.  The CM and the SA client stay lazy: a started CM would claim
management class 0x07 on every port, and SA clients are per user AL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.al import PnpClass, PnpOrder, Subsystem

if TYPE_CHECKING:
    from ibal.al import AlManager

_IO = frozenset({PnpClass.IOU, PnpClass.IOC})


def _start_dm_agent(mgr: AlManager) -> object:
    from ibal.dm.agent import DmService  # here: ibal.al never imports ibal.dm

    return DmService.start(mgr)


def _start_ioc_discovery(mgr: AlManager) -> object:
    from ibal.dm.discovery import Discovery

    return Discovery.start(mgr)


dm_agent = Subsystem(PnpOrder.DM, _IO, _start_dm_agent)
ioc_discovery = Subsystem(PnpOrder.DM, _IO, _start_ioc_discovery)

__all__ = ["dm_agent", "ioc_discovery"]
