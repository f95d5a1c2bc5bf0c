"""A MAD client for diagnostics tools (libibmad's RPC layer, in ibal terms).

:class:`MadClient` sends SMPs (LID routed or directed route), PerfMgt and SA
requests and matches their responses by TID, with its own response time-out
and retries, in two forms: blocking (:meth:`MadClient.call` and the
``smp_get``/``perf_get``/``sa_get`` helpers) and many in flight
(:meth:`MadClient.post` + :meth:`MadClient.poll`, or :meth:`MadClient.call_many`
with a window of outstanding requests, or :meth:`MadClient.drive`).

Targets are :class:`PortId`\\ s, addressed like libibmad's ``ib_portid_t``: a
LID, a directed-route path (``"0,1,3"``: the out port of each hop after the
local port 0) or a port GUID resolved through the SA (:meth:`MadClient.resolve_guid`).

The client talks to one port through a :class:`MadPort`: :class:`AlMadPort`
drives the AL's transport-level MAD agents (an alias QP per QP0/QP1, one
agent per class), so the CA's provider picks the transport.  The time-out is
the client's own: under umad2sim (ibsim) nothing times an unanswered request
out, so each retry is a fresh TID and a late answer to an earlier try is
dropped.

One module per job: :mod:`~ibal.mad.rpc.portid` (targets and their addresses),
:mod:`~ibal.mad.rpc.request` (the records and the request builders),
:mod:`~ibal.mad.rpc.client` (matching, time-outs, retries, windows),
:mod:`~ibal.mad.rpc.ports` (the AL ports and :func:`pick_port`).
"""

from __future__ import annotations

from ibal.mad.rpc.client import MadClient, MadPort
from ibal.mad.rpc.portid import PortId, parse_dr_path, parse_portid
from ibal.mad.rpc.ports import VIAS, AlMadPort, ServiceMadPort, pick_port
from ibal.mad.rpc.request import MadError, Reply, Request, smp_request

__all__ = [
    "VIAS",
    "AlMadPort",
    "MadClient",
    "MadError",
    "MadPort",
    "PortId",
    "Reply",
    "Request",
    "ServiceMadPort",
    "parse_dr_path",
    "parse_portid",
    "pick_port",
    "smp_request",
]
