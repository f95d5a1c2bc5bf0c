"""What clients set in the mock SA: service records, multicast groups, subscriptions.

Each store answers one attribute's Set/Delete/Get with an SA status and the
records of the answer, as OpenSM does (``osm_sa_service_record.c``,
``osm_sa_mcmember_record.c``, ``osm_sa_informinfo.c``, read for facts):

- ServiceRecord: Set needs ServiceID and ServiceGID (else ERR_REQ_INVALID),
  P_Key defaults to 0xFFFF; the record (ServiceID, GID, P_Key) is replaced
  by a later Set; a lease other than 0xFFFFFFFF ends that many seconds on
  the fabric clock, and a Get shows what is left of it.
- MCMemberRecord: a join (Set) needs PortGID and JoinState (else
  ERR_INSUFFICIENT_COMPONENTS); a group that does not exist is created when
  Q_Key, P_Key, SL, FlowLabel and TClass are given and the joiner is a full
  member (MGID 0 gets an SA-assigned MGID), with the lowest free MLID from
  0xC000; join states of a port are ORed; a leave (Delete) clears bits, and a
  group goes when its last full member left.  OpenSM's IPoIB broadcast group
  (ff12:401b:ffff::ffff:ffff, MLID 0xC000) exists from the start.
- InformInfo: subscribe/unsubscribe per subscriber (GID, LID), matched
  against notices with OpenSM's rules (GID or LID range, IsGeneric, Type,
  TrapNumber/DeviceID, ProducerType/VendorID; 0xFFFF/0xFFFFFF wildcards).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ibal.providers.mock.sa_records import (
    LINK_RATE,
    RATE_GBPS,
    SELECT_EQ,
    Values,
    mask_bits,
    matches,
    select,
)
from ibal.wire.fields import Table, Value
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MadStatus

INFINITE_LEASE = 0xFFFF_FFFF
FIRST_MLID = 0xC000
LAST_MLID = 0xFFFE
IPOIB_MGID = bytes.fromhex("ff12401bffff000000000000ffffffff")
IPOIB_QKEY = 0x0B1B
SA_MGID_SIGNATURE = 0xA01B  # what OpenSM puts in MGIDs it assigns (ff1S:a01b:PKEY::n)
FULL_MEMBER = 0x1
NON_MEMBER = 0x2
ZERO_GID = bytes(16)

_OK = MadStatus.SUCCESS
_INVALID = MadStatus.SA_REQ_INVALID
_INSUFFICIENT = MadStatus.SA_INSUFFICIENT_COMPONENTS
_NO_RECORDS = MadStatus.SA_NO_RECORDS

Answer = tuple[int, list[bytes]]


def _has(table: Table, mask: int, *names: str) -> bool:
    bits = mask_bits(table)
    return all(mask & bits[n] for n in names)


# ============================================================ services
@dataclass
class _Service:
    values: Values
    expires: float | None


class Services:
    """Registered ServiceRecords and their leases."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self._recs: dict[tuple[int, bytes, int], _Service] = {}

    def __len__(self) -> int:
        self._expire()
        return len(self._recs)

    def _expire(self) -> None:
        t = self.now()
        for key in [k for k, s in self._recs.items() if s.expires is not None and s.expires <= t]:
            del self._recs[key]

    def _shown(self, s: _Service) -> bytes:
        vals = dict(s.values)
        if s.expires is not None:
            vals["service_lease"] = max(0, int(s.expires - self.now()))
        return sa.SERVICE_RECORD.encode(vals)

    @staticmethod
    def _rid(vals: Values, mask: int) -> tuple[int, bytes, int]:
        given = _has(sa.SERVICE_RECORD, mask, "service_p_key")
        pkey = int(vals["service_p_key"]) if given else 0xFFFF
        return int(vals["service_id"]), bytes(vals["service_gid"]), pkey

    def set(self, vals: Values, mask: int) -> Answer:
        if not _has(sa.SERVICE_RECORD, mask, "service_id", "service_gid"):
            return _INVALID, []
        self._expire()
        rid = self._rid(vals, mask)
        stored = dict(vals)
        stored["service_p_key"] = rid[2]
        lease = int(vals["service_lease"])
        expires = None if lease == INFINITE_LEASE else self.now() + lease
        s = self._recs[rid] = _Service(stored, expires)
        return _OK, [self._shown(s)]

    def delete(self, vals: Values, mask: int) -> Answer:
        if not _has(sa.SERVICE_RECORD, mask, "service_id", "service_gid"):
            return _INVALID, []
        self._expire()
        s = self._recs.pop(self._rid(vals, mask), None)
        if s is None:
            return _NO_RECORDS, []
        return _OK, [self._shown(s)]

    def get(self, vals: Values, mask: int) -> Answer:
        self._expire()
        t = sa.SERVICE_RECORD
        out = [self._shown(s) for s in self._recs.values()
               if matches(t, vals, s.values, mask, skip=("service_lease",))]  # fmt: skip
        return _OK, out


# ============================================================ multicast
@dataclass
class Group:
    """One multicast group: its parameters and each member port's JoinState."""

    mgid: bytes
    mlid: int
    q_key: int
    p_key: int
    mtu: int
    rate: int
    life: int
    sl: int = 0
    flow_label: int = 0
    tclass: int = 0
    hop_limit: int = 0
    scope: int = 2
    well_known: bool = False
    members: dict[bytes, int] = field(default_factory=dict)

    def record(self, port_gid: bytes = ZERO_GID, join_state: int = 0) -> bytes:
        return sa.MCMEMBER_RECORD.encode(
            mgid=self.mgid, port_gid=port_gid, q_key=self.q_key, mlid=self.mlid,
            mtu_selector=SELECT_EQ, mtu=self.mtu, tclass=self.tclass, p_key=self.p_key,
            rate_selector=SELECT_EQ, rate=self.rate, packet_life_time_selector=SELECT_EQ,
            packet_life_time=self.life, sl=self.sl, flow_label=self.flow_label,
            hop_limit=self.hop_limit, scope=self.scope, join_state=join_state,
        )  # fmt: skip

    @property
    def has_full_member(self) -> bool:
        return any(js & FULL_MEMBER for js in self.members.values())


_CREATE = ("q_key", "p_key", "sl", "flow_label", "tclass")


class Groups:
    """Multicast groups by MGID; ``on_change(trap, mgid)`` raises traps 66 and 67."""

    def __init__(self, subnet_timeout: int, on_change: Callable[[int, bytes], None]) -> None:
        self.subnet_timeout = subnet_timeout
        self.on_change = on_change  # (trap number, MGID)
        self.groups: dict[bytes, Group] = {}
        self._assigned = 0
        ipoib = Group(IPOIB_MGID, FIRST_MLID, IPOIB_QKEY, 0xFFFF, mtu=4, rate=3,
                      life=subnet_timeout, well_known=True)  # fmt: skip
        self.groups[IPOIB_MGID] = ipoib

    def by_mlid(self, mlid: int) -> Group | None:
        for g in self.groups.values():
            if g.mlid == mlid:
                return g
        return None

    def receivers(self, mlid: int) -> frozenset[bytes] | None:
        """The port GIDs a datagram to ``mlid`` reaches (full and non-members; a
        send-only member does not receive); ``None`` for an MLID the SA does not run."""
        g = self.by_mlid(mlid)
        if g is None:
            return None
        return frozenset(pg for pg, js in g.members.items() if js & (FULL_MEMBER | NON_MEMBER))

    def _free_mlid(self) -> int | None:
        used = {g.mlid for g in self.groups.values()}
        for mlid in range(FIRST_MLID, LAST_MLID + 1):
            if mlid not in used:
                return mlid
        return None

    def join(self, vals: Values, mask: int, port_mtu: int) -> Answer:
        t = sa.MCMEMBER_RECORD
        if not _has(t, mask, "port_gid", "join_state"):
            return _INSUFFICIENT, []
        js = int(vals["join_state"])
        if js == 0:
            return _INVALID, []
        mgid = bytes(vals["mgid"]) if _has(t, mask, "mgid") else ZERO_GID
        port_gid = bytes(vals["port_gid"])
        g = self.groups.get(mgid)
        if g is None:
            g = self._create(vals, mask, mgid, js, port_mtu)
            if g is None:
                return (_INSUFFICIENT if not _has(t, mask, *_CREATE) else _INVALID), []
        elif not self._fits(g, vals, mask):
            return _INVALID, []
        g.members[port_gid] = g.members.get(port_gid, 0) | js
        return _OK, [g.record(port_gid, g.members[port_gid])]

    def _create(self, vals: Values, mask: int, mgid: bytes, js: int, port_mtu: int
                ) -> Group | None:
        t = sa.MCMEMBER_RECORD
        if not _has(t, mask, *_CREATE) or not js & FULL_MEMBER:
            return None
        if mgid != ZERO_GID and mgid[0] != 0xFF:
            return None
        v = {k: int(vals[k]) for k in (*_CREATE, "mtu", "mtu_selector", "rate",
                                       "rate_selector", "packet_life_time", "scope",
                                       "packet_life_time_selector", "hop_limit")}
        mtu: int | None = port_mtu
        if _has(t, mask, "mtu"):
            mtu = select(port_mtu, v["mtu_selector"] if _has(t, mask, "mtu_selector")
                         else SELECT_EQ, v["mtu"])  # fmt: skip
        rate: int | None = LINK_RATE
        if _has(t, mask, "rate"):
            rate = select(LINK_RATE, v["rate_selector"] if _has(t, mask, "rate_selector")
                          else SELECT_EQ, v["rate"], RATE_GBPS)  # fmt: skip
        life = v["packet_life_time"] if _has(t, mask, "packet_life_time") else self.subnet_timeout
        mlid = self._free_mlid()
        if mtu is None or rate is None or mlid is None:
            return None
        scope = v["scope"] if _has(t, mask, "scope") else 2
        if mgid == ZERO_GID:
            self._assigned += 1
            mgid = (bytes([0xFF, 0x10 | scope]) + SA_MGID_SIGNATURE.to_bytes(2, "big")
                    + (v["p_key"] | 0x8000).to_bytes(2, "big") + bytes(6)
                    + self._assigned.to_bytes(4, "big"))  # fmt: skip
        else:
            scope = mgid[1] & 0xF
        g = Group(mgid, mlid, v["q_key"], v["p_key"] | 0x8000, mtu, rate, life, v["sl"],
                  v["flow_label"], v["tclass"], v["hop_limit"], scope)  # fmt: skip
        self.groups[mgid] = g
        self.on_change(66, mgid)
        return g

    @staticmethod
    def _fits(g: Group, vals: Values, mask: int) -> bool:
        """Whether a join's components agree with the group it joins."""
        t = sa.MCMEMBER_RECORD
        for name, have in (("q_key", g.q_key), ("sl", g.sl), ("flow_label", g.flow_label),
                           ("tclass", g.tclass), ("mlid", g.mlid)):  # fmt: skip
            if _has(t, mask, name) and int(vals[name]) != have:
                return False
        if _has(t, mask, "p_key") and int(vals["p_key"]) & 0x7FFF != g.p_key & 0x7FFF:
            return False
        for name, have, order in (("mtu", g.mtu, None), ("rate", g.rate, RATE_GBPS)):
            if _has(t, mask, name):
                given = _has(t, mask, f"{name}_selector")
                sel = int(vals[f"{name}_selector"]) if given else SELECT_EQ
                want = int(vals[name])
                got = select(have, sel, want, order)
                if got != have and not (sel == SELECT_EQ and want == have):
                    return False
        return True

    def leave(self, vals: Values, mask: int) -> Answer:
        t = sa.MCMEMBER_RECORD
        if not _has(t, mask, "mgid", "port_gid", "join_state"):
            return _INSUFFICIENT, []
        g = self.groups.get(bytes(vals["mgid"]))
        port_gid = bytes(vals["port_gid"])
        js = int(vals["join_state"])
        if g is None or port_gid not in g.members or not js & g.members[port_gid]:
            return _INVALID, []
        rec = g.record(port_gid, js & g.members[port_gid])
        left = g.members[port_gid] & ~js
        if left:
            g.members[port_gid] = left
        else:
            del g.members[port_gid]
        self._collect(g)
        return _OK, [rec]

    def drop_port(self, port_gid: bytes) -> None:
        """A port left the subnet: it leaves every group (OpenSM's drop manager)."""
        for g in list(self.groups.values()):
            if g.members.pop(port_gid, None) is not None:
                self._collect(g)

    def _collect(self, g: Group) -> None:
        if not g.well_known and not g.has_full_member:
            del self.groups[g.mgid]
            self.on_change(67, g.mgid)

    def get(self, vals: Values, mask: int, requester_gid: bytes, trusted: bool) -> Answer:
        """Member records; one without port for a group nobody joined, and to a
        requester without the SM_Key, a port's own records only (others: group records)."""
        t = sa.MCMEMBER_RECORD
        out: list[bytes] = []
        for g in self.groups.values():
            shown = [(pg, js) for pg, js in g.members.items() if trusted or pg == requester_gid]
            for pg, js in shown or [(ZERO_GID, 0)]:
                rec = g.record(pg, js)
                if matches(t, vals, t.decode(rec), mask, skip=_SELECTORS):
                    out.append(rec)
        return _OK, out


_SELECTORS = ("mtu_selector", "rate_selector", "packet_life_time_selector")


# ============================================================ subscriptions
@dataclass
class Subscription:
    subscriber_gid: bytes
    lid: int  # where Reports go (the subscriber's LID)
    info: Values  # the InformInfo as set
    enum: int

    @property
    def qpn(self) -> int:
        return int(self.info["qpn"])

    def wants(self, notice: Values) -> bool:
        """OpenSM's matching rules (osm_inform.c match_notice_to_inf_rec)."""
        ii = self.info
        gid = bytes(ii["gid"])
        if gid != ZERO_GID:
            if gid != bytes(notice["issuer_gid"]):
                return False
        elif ii["lid_range_begin"] != 0xFFFF:
            lid = int(notice["issuer_lid"])
            if not int(ii["lid_range_begin"]) <= lid <= int(ii["lid_range_end"]):
                return False
        if bool(ii["is_generic"]) != bool(notice["is_generic"]):
            return False
        if ii["type"] != 0xFFFF and ii["type"] != notice["type"]:
            return False
        if ii["trap_number"] != 0xFFFF and ii["trap_number"] != notice["trap_number"]:
            return False
        return ii["producer_type"] in (0xFFFFFF, notice["producer_type"])


_II_KEY = ("gid", "lid_range_begin", "lid_range_end", "is_generic", "type", "trap_number",
           "producer_type", "qpn")  # fmt: skip


class Subscriptions:
    """InformInfo subscriptions."""

    def __init__(self) -> None:
        self.subs: list[Subscription] = []
        self._enum = 0

    def set(self, info: Values, subscriber_gid: bytes, lid: int) -> int:
        """Subscribe or unsubscribe; the SA status."""
        key = tuple(info[k] for k in _II_KEY)
        same = [s for s in self.subs if s.subscriber_gid == subscriber_gid
                and tuple(s.info[k] for k in _II_KEY) == key]  # fmt: skip
        if int(info["subscribe"]) == 1:
            if not same:
                self.subs.append(Subscription(subscriber_gid, lid, dict(info), self._enum))
                self._enum += 1
            return _OK
        if int(info["subscribe"]) != 0 or not same:
            return _INVALID
        for s in same:
            self.subs.remove(s)
        return _OK

    def drop_port(self, port_gid: bytes) -> None:
        self.subs = [s for s in self.subs if s.subscriber_gid != port_gid]

    def records(self, vals: Values, mask: int) -> list[bytes]:
        t = sa.INFORM_INFO_RECORD
        out = []
        for s in self.subs:
            fields: dict[str, Value] = {k: v for k, v in s.info.items() if not k.startswith("resv")}
            rec = t.encode(subscriber_gid=s.subscriber_gid, enum=s.enum, **fields)
            if matches(t, vals, t.decode(rec), mask):
                out.append(rec)
        return out
