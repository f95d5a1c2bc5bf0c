"""The handles an rdma_core CA gives out, and what it knows about a port.

Each handle is a small record owned by its CA (``ci``): the CA's verbs check a
handle's kind, owner and ``alive`` flag before use (see :mod:`.state`) and keep
its dependency counts (``users``).  The records hold no logic beyond
:meth:`Cq.add_flushed` and :meth:`PortInfo.roce_gid`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from ipaddress import IPv6Address
from typing import Any

from ibal.ci.interface import AsyncEventCallback, CompletionCallback
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.fastpath import FastPoller, FastRecvQueue, FastSendQueue
from ibal.providers.rdma_core.wr import RecvQueue, SendQueue
from ibal.types import AccessFlags, AvAttr, Gid, LinkLayer, PdType, QpCaps, QpState, QpType, Wc

ZERO_GID = IPv6Address(0)


class HandleBase:
    __slots__ = ("alive", "ci")

    def __init__(self, ci: Any) -> None:
        self.ci = ci
        self.alive = True


class CaHandle(HandleBase):
    __slots__ = ("completion_cb", "context", "event_cb")

    def __init__(
        self,
        ci: Any,
        completion_cb: CompletionCallback,
        event_cb: AsyncEventCallback,
        context: Any,
    ) -> None:
        super().__init__(ci)
        self.completion_cb = completion_cb
        self.event_cb = event_cb
        self.context = context


class Pd(HandleBase):
    __slots__ = ("pd_type", "pv", "users")

    def __init__(self, ci: Any, pv: Any, pd_type: PdType) -> None:
        super().__init__(ci)
        self.pv = pv
        self.pd_type = pd_type
        self.users = 0


class Av(HandleBase):
    __slots__ = ("attr", "pd", "ptr", "pv")

    def __init__(self, ci: Any, pd: Pd, pv: Any, attr: AvAttr, ptr: int) -> None:
        super().__init__(ci)
        self.pd = pd
        self.pv = pv
        self.attr = attr
        self.ptr = ptr


class Cq(HandleBase):
    __slots__ = (
        "armed",
        "channel",
        "context",
        "fd",
        "lock",
        "orphans",
        "pending",
        "poller",
        "pv",
        "size",
        "users",
        "wc_cache",
    )

    def __init__(self, ci: Any, context: Any) -> None:
        super().__init__(ci)
        self.context = context
        self.pv: Any = None
        self.channel: Any = None
        self.fd: int | None = None
        self.size = 0
        self.users = 0
        self.lock = threading.Lock()
        self.orphans: list[set[int]] = []
        self.pending: list[tuple[int, ...]] = []  # completions made here, not by the device
        self.armed = False
        self.poller: FastPoller | None = None
        self.wc_cache: dict[tuple[int, int, int, int], Wc] = {}

    def add_flushed(self, wcs: list[tuple[int, ...]]) -> bool:
        """Queue completions made by the provider; True if the CQ was armed (now disarmed)."""
        with self.lock:
            self.pending.extend(wcs)
            fire, self.armed = self.armed, False
        return fire


class Srq(HandleBase):
    __slots__ = ("context", "max_wr", "pd", "ptr", "pv", "rq", "rtok", "users")

    def __init__(self, ci: Any, pd: Pd, context: Any) -> None:
        super().__init__(ci)
        self.pd = pd
        self.context = context
        self.pv: Any = None
        self.ptr = 0
        self.rq: RecvQueue | FastRecvQueue | None = None
        self.rtok: set[int] = set()
        self.users = 0
        self.max_wr = 0


class Qp(HandleBase):
    __slots__ = (
        "alternate_av",
        "caps",
        "context",
        "mcast",
        "num",
        "pd",
        "pkey_index",
        "port_num",
        "primary_av",
        "ptr",
        "pv",
        "qp_type",
        "recv_cq",
        "rq",
        "rtok",
        "send_cq",
        "sq",
        "sq_signaled",
        "srq",
        "state",
        "timeout",
    )

    def __init__(self, ci: Any, pd: Pd, qp_type: QpType, context: Any) -> None:
        super().__init__(ci)
        self.pd = pd
        self.qp_type = qp_type
        self.context = context
        self.pv: Any = None
        self.ptr = 0
        self.num = 0
        self.state = QpState.RESET
        self.caps = QpCaps()
        self.sq_signaled = True
        self.send_cq: Cq | None = None
        self.recv_cq: Cq | None = None
        self.srq: Srq | None = None
        self.sq: SendQueue | FastSendQueue | None = None
        self.rq: RecvQueue | FastRecvQueue | None = None
        self.rtok: set[int] = set()
        self.mcast: dict[tuple[bytes, int], int] = {}
        self.port_num = 0
        self.pkey_index = 0
        self.timeout = 14
        self.primary_av: AvAttr | None = None
        self.alternate_av: AvAttr | None = None


class Mr(HandleBase):
    __slots__ = ("access", "buffer", "length", "mws", "pd", "pv", "vaddr")

    def __init__(self, ci: Any) -> None:
        super().__init__(ci)
        self.pd: Pd | None = None
        self.pv: Any = None
        self.buffer: memoryview | None = None
        self.vaddr = 0
        self.length = 0
        self.access = AccessFlags.NONE
        self.mws: set[Mw] = set()


class Mw(HandleBase):
    __slots__ = ("bound", "last", "pd", "pv")

    def __init__(self, ci: Any, pd: Pd, pv: Any) -> None:
        super().__init__(ci)
        self.pd = pd
        self.pv = pv
        self.bound: Mr | None = None
        self.last: Mr | None = None


class Mcast(HandleBase):
    __slots__ = ("gid", "ifindex", "lid", "qp")

    def __init__(self, ci: Any, qp: Qp, gid: bytes, lid: int, ifindex: int) -> None:
        super().__init__(ci)
        self.qp = qp
        self.gid = gid
        self.lid = lid
        self.ifindex = ifindex


@dataclass
class PortInfo:
    """What AV and QP translation need to know about a port."""

    link_layer: LinkLayer
    gids: list[Gid | None] = field(default_factory=list)
    gid_types: list[int] = field(default_factory=list)
    pkeys: tuple[int, ...] = ()
    ifindex: int = 0
    v2_gids: frozenset[bytes] = frozenset()

    def roce_gid(self, ipv4: bool) -> int | None:
        """Index of the first RoCE v2 (then v1) GID of the wanted address family."""
        for want in (C.IBV_GID_TYPE_ROCE_V2, C.IBV_GID_TYPE_ROCE_V1):
            for i, g in enumerate(self.gids):
                if g is None or g == ZERO_GID or self.gid_types[i] != want:
                    continue
                if (g.ipv4_mapped is not None) == ipv4 and (ipv4 or not g.is_link_local):
                    return i
        return None


# ------------------------------------------------------------------- the CA
