"""Multicast attach and detach.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.ci.interface import (
    Handle,
)
from ibal.providers.mock.objects import (
    MockMcast,
)
from ibal.status import (
    InsufficientResources,
    InvalidGid,
    InvalidLid,
    InvalidMcastHandle,
    InvalidParameter,
    InvalidServiceType,
    MaxMcastQpsReached,
)
from ibal.types import (
    MULTICAST_LID_BASE,
    Gid,
    QpType,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    CaState,
    verb,
)


class McastVerbs(CaState):
    """Multicast attach and detach."""

    @verb
    def attach_mcast(self, h_qp: Handle, gid: Gid, lid: int) -> Handle:
        qp = self._h_qp(h_qp)
        if qp.qp_type is not QpType.UD:
            raise InvalidServiceType(f"only UD QPs join multicast groups, not {qp.qp_type.name}")
        if not isinstance(gid, Gid) or not gid.is_multicast:
            raise InvalidGid(f"{gid!r} is not a multicast GID")
        if not isinstance(lid, int) or not MULTICAST_LID_BASE <= lid <= 0xFFFE:
            raise InvalidLid(f"LID {lid!r} is not a multicast LID (0xC000..0xFFFE)")
        groups = self._engine.mcast_groups
        members = groups.get(lid, [])
        for m in members:
            if m.qp is qp and m.gid == gid:
                raise InvalidParameter(f"QP 0x{qp.num:x} is already attached to {gid}")
        if not any(m.qp.ca is self for m in members):
            mine = sum(1 for ms in groups.values() if any(m.qp.ca is self for m in ms))
            if mine >= self.limits.max_mcast_grps:
                raise InsufficientResources(f"{self.name} is in {mine} groups already")
        if sum(1 for m in members if m.qp.ca is self) >= self.limits.max_qps_per_mcast_grp:
            raise MaxMcastQpsReached(f"group 0x{lid:x} has its maximum of QPs on {self.name}")
        m = MockMcast(qp, gid, lid)
        groups.setdefault(lid, []).append(m)
        qp.mcasts += 1
        return m

    @verb
    def detach_mcast(self, h_mcast: Handle) -> None:
        m = h_mcast
        if type(m) is not MockMcast or m.qp.ca is not self or not m.alive:
            raise InvalidMcastHandle(f"not a multicast attachment of {self.name}: {m!r}")
        m.alive = False
        m.qp.mcasts -= 1
        members = self._engine.mcast_groups[m.lid]
        members.remove(m)
        if not members:
            del self._engine.mcast_groups[m.lid]
