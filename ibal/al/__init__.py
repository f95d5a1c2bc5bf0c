"""The access layer (``ib_al.h``): AL instances, CAs and verbs objects over the CI contract.

See ``docs/api.md``.  Every handle is an :class:`~ibal.al.obj.AlObject`;
callbacks run on the manager's callback queues (``mgr.queues``); upper layers
join the object tree with :class:`Dependent`; ``ibal.compat`` (above every layer) has the C
spellings.
"""

from typing import TYPE_CHECKING, Any

from ibal.al.access_layer import AccessLayer
from ibal.al.alias import AliasQp, MadAgent
from ibal.al.av import Av
from ibal.al.ca import Ca
from ibal.al.cq import Cq
from ibal.al.dependent import Dependent
from ibal.al.dispatcher import CallbackQueue, CallbackQueues, Dispatcher, call_user, in_callback
from ibal.al.fmr import Fmr
from ibal.al.mad_port import read_mad_slot
from ibal.al.manager import (
    PROVIDERS_ENV,
    SIMULATED_SKIPPED,
    AlManager,
    default_manager,
    open_al,
    start_default_providers,
)
from ibal.al.mr import Mr, Mw
from ibal.al.obj import SYNC_DESTROY, AlObject, DestroyCallback, SyncDestroy
from ibal.al.pd import Pd
from ibal.al.pnp import (
    DeviceAttrMask,
    PnpClass,
    PnpEvent,
    PnpEventBit,
    PnpOrder,
    PnpRec,
    PnpRegistration,
)
from ibal.al.pnp_io import IoDevices
from ibal.al.qp import McastAttachment, Qp, QpCreate
from ibal.al.qp_work import DRAIN_RECV_WR_ID, DRAIN_SEND_WR_ID
from ibal.al.ranges import check_timeout
from ibal.al.srq import Srq
from ibal.al.stash import Stash, StashKey
from ibal.al.subsystems import Subsystem
from ibal.al.timer import Timer, TimerScope, TimerService

if TYPE_CHECKING:
    from ibal.al.connect import (
        ConnectOptions,
        Endpoint,
        RemoteEndpoint,
        connect_qp,
        default_access,
        endpoint,
        path_to,
        preferred_gid,
        transitions,
    )

_CONNECT = frozenset({
    "ConnectOptions", "Endpoint", "RemoteEndpoint", "connect_qp", "default_access", "endpoint",
    "path_to", "preferred_gid", "transitions",
})  # fmt: skip


def __getattr__(name: str) -> Any:
    # The connection helpers load on first use (~2 ms): the MAD tools never connect a QP.
    if name in _CONNECT:
        from ibal.al import connect

        value = getattr(connect, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DRAIN_RECV_WR_ID",
    "DRAIN_SEND_WR_ID",
    "PROVIDERS_ENV",
    "SIMULATED_SKIPPED",
    "SYNC_DESTROY",
    "AccessLayer",
    "AlManager",
    "AlObject",
    "AliasQp",
    "Av",
    "Ca",
    "CallbackQueue",
    "CallbackQueues",
    "ConnectOptions",
    "Cq",
    "Dependent",
    "DestroyCallback",
    "DeviceAttrMask",
    "Dispatcher",
    "Endpoint",
    "Fmr",
    "IoDevices",
    "MadAgent",
    "McastAttachment",
    "Mr",
    "Mw",
    "Pd",
    "PnpClass",
    "PnpEvent",
    "PnpEventBit",
    "PnpOrder",
    "PnpRec",
    "PnpRegistration",
    "Qp",
    "QpCreate",
    "RemoteEndpoint",
    "Srq",
    "Stash",
    "StashKey",
    "Subsystem",
    "SyncDestroy",
    "Timer",
    "TimerScope",
    "TimerService",
    "call_user",
    "check_timeout",
    "connect_qp",
    "default_access",
    "default_manager",
    "endpoint",
    "in_callback",
    "open_al",
    "path_to",
    "preferred_gid",
    "read_mad_slot",
    "start_default_providers",
    "transitions",
]
