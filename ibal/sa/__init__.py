"""Subnet administration clients (docs/sa.md): queries, services, multicast, subscriptions.

Built on the access layer's and ``ibal.mad``'s public API only.  The shared
core: :class:`~ibal.sa.port.SaPort` (the SA seen from one local port, one per
AL instance and port) runs :class:`~ibal.sa.txn.SaTxn` transactions and hands
back :class:`~ibal.sa.txn.SaAnswer` s.
"""

from ibal.sa.ats import lookup_address, register_address
from ibal.sa.inform import (
    ReportRec,
    SubRec,
    SubReq,
    Subscription,
    ib_subscribe,
    ib_unsubscribe,
    subscribe,
)
from ibal.sa.inform_fsm import InformInfo, Notice
from ibal.sa.mcast import (
    JoinState,
    McastMembership,
    McastPhase,
    McastRec,
    McastReq,
    MemberRec,
    Scope,
    join_mcast,
    join_mcast_req,
    leave_mcast,
)
from ibal.sa.port import SaPort, SaRequest
from ibal.sa.service import (
    RegSvcFlags,
    RegSvcRec,
    RegSvcReq,
    ServiceRecord,
    ServiceRegistration,
    dereg_svc,
    reg_svc,
    register_service,
)
from ibal.sa.txn import SaAnswer, decode_answer

__all__ = [
    "InformInfo",
    "JoinState",
    "McastMembership",
    "McastPhase",
    "McastRec",
    "McastReq",
    "MemberRec",
    "Notice",
    "RegSvcFlags",
    "RegSvcRec",
    "RegSvcReq",
    "ReportRec",
    "SaAnswer",
    "SaPort",
    "SaRequest",
    "Scope",
    "ServiceRecord",
    "ServiceRegistration",
    "SubRec",
    "SubReq",
    "Subscription",
    "decode_answer",
    "dereg_svc",
    "ib_subscribe",
    "ib_unsubscribe",
    "join_mcast",
    "join_mcast_req",
    "leave_mcast",
    "lookup_address",
    "reg_svc",
    "register_address",
    "register_service",
    "subscribe",
]
