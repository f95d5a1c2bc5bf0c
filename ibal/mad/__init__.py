"""MAD pools and services (docs/mad.md), built on the access layer's public API.

The MAD formats (class tables, headers, dumps, RMPP headers, TIDs) are
:mod:`ibal.wire.mad`; RMPP's sender and receiver are :mod:`ibal.transport.rmpp`.
The names exported here load on first use, so a tool that needs only the
diagnostic client (:mod:`ibal.mad.rpc`) does not pay for the services' imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibal.mad.pool import ElementState, MadElement, MadPool, PoolKey, get_mad_buf, put_mad
    from ibal.mad.rmpp_service import TransferSessions, enable_rmpp
    from ibal.mad.service import MadService, local_mad, reg_mad_svc
    from ibal.mad.svc import MadSvc, MadSvcType, RmppSessions
    from ibal.mad.transaction import transact

_SERVICE_NAMES = {
    "ElementState": "pool",
    "MadElement": "pool",
    "MadPool": "pool",
    "PoolKey": "pool",
    "get_mad_buf": "pool",
    "put_mad": "pool",
    "MadService": "service",
    "local_mad": "service",
    "reg_mad_svc": "service",
    "MadSvc": "svc",
    "MadSvcType": "svc",
    "RmppSessions": "svc",
    "TransferSessions": "rmpp_service",
    "enable_rmpp": "rmpp_service",
    "transact": "transaction",
}


def __getattr__(name: str) -> Any:
    module = _SERVICE_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ibal.mad' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ibal.mad.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ElementState",
    "MadElement",
    "MadPool",
    "MadService",
    "MadSvc",
    "MadSvcType",
    "PoolKey",
    "RmppSessions",
    "TransferSessions",
    "enable_rmpp",
    "get_mad_buf",
    "local_mad",
    "put_mad",
    "reg_mad_svc",
    "transact",
]
