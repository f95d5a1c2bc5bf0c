"""The client's records (:class:`Request`, :class:`Reply`, :class:`MadError`) and the
request builders: SMP requests, and the MAD bytes of a request (a checked build once
per kind of request, then only the TID and DR path patched in)."""

from __future__ import annotations

from typing import Any

from ibal.mad.rpc.portid import PortId
from ibal.records import record
from ibal.wire.mad import header
from ibal.wire.mad.consts import DR_DIRECTION, MadStatus, Method, MgmtClass

__all__ = ["MadError", "Reply", "Request", "build_mad", "smp", "smp_request"]


class MadError(RuntimeError):
    """A query failed: no answer after the retries, or an error status in the answer."""


@record
class Request:
    """One query: class, method, attribute and modifier, data, and where it goes."""

    mgmt_class: int
    method: int
    attr_id: int
    to: PortId
    attr_mod: int = 0
    data: bytes = b""
    comp_mask: int = 0  # SA only
    context: Any = None


@record
class Reply:
    """How a :class:`Request` ended: the response MAD, or ``None`` after the retries."""

    request: Request
    mad: bytes | None
    tries: int

    @property
    def status(self) -> int:
        """The MAD status (the DR D bit masked); ``-1`` when nothing came."""
        if self.mad is None:
            return -1
        st = int.from_bytes(self.mad[4:6], "big")
        return st & ~DR_DIRECTION if self.mad[1] == MgmtClass.SUBN_DR else st

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def data(self) -> memoryview:
        """The attribute data (a view of the response); ``MadError`` if it failed."""
        if self.mad is None or self.status != 0:
            raise MadError(self.error())
        return header.payload(self.mad)

    def error(self) -> str:
        r = self.request
        what = f"attr 0x{r.attr_id:04x} mod {r.attr_mod} class 0x{r.mgmt_class:02x} to {r.to}"
        if self.mad is None:
            return f"no response to {what} after {self.tries} tries"
        try:
            name = MadStatus(self.status).name
        except ValueError:
            name = "?"
        return f"{what}: status 0x{self.status:04x} ({name})"


def smp(method: int, attr: int, to: PortId, mod: int, data: bytes) -> Request:
    """An SMP request: LID routed, or directed route when ``to`` has a path."""
    cls = MgmtClass.SUBN_DR if to.directed else MgmtClass.SUBN_LID
    return Request(cls, method, attr, to, mod, data)


def smp_request(attr: int, to: PortId, mod: int = 0, *, context: Any = None) -> Request:
    """A SubnGet(attr) request for :meth:`~ibal.mad.rpc.MadClient.post`."""
    req = smp(Method.GET, attr, to, mod, b"")
    req.context = context
    return req


def _byte(table: Any, name: str) -> int:
    return int(table.by_name[name].offset) // 8


_TID = _byte(header.MAD_HEADER, "tid")
_HOPS = _byte(header.DR_HEADER, "hop_count")
_PATH = _byte(header.DR_SMP, "initial_path") + 1  # entry 0 of the path is unused
assert _HOPS + 1 == _TID < _TID + 8 <= _PATH  # the order build_mad patches them in
_templates: dict[tuple[Any, ...], bytes] = {}


def build_mad(r: Request, tid: int, m_key: int = 0) -> bytes:
    """The request's MAD: a checked build once per kind of request, then a copy of it
    with this TID (and DR path) patched in, which is what a sweep's many SMPs differ by.
    ``m_key``: the SMP's M_Key (other classes have none)."""
    to = r.to
    key = (r.mgmt_class, r.method, r.attr_id, r.attr_mod, r.data, r.comp_mask, to.dr_slid,
           to.dr_dlid, None if to.dr_path is None else 0, m_key)  # fmt: skip
    tpl = _templates.get(key)
    if tpl is None:
        if len(_templates) > 512:
            _templates.clear()
        tpl = _templates[key] = bytes(header.build(
            r.mgmt_class, r.method, r.attr_id, tid=0, attr_mod=r.attr_mod, data=r.data,
            dr_path=() if to.dr_path is not None else None, dr_slid=to.dr_slid,
            dr_dlid=to.dr_dlid, comp_mask=r.comp_mask, m_key=m_key,
        ))  # fmt: skip
    path = to.dr_path
    if path is None:
        return tpl[:_TID] + tid.to_bytes(8, "big") + tpl[_TID + 8 :]
    n = len(path)
    # hop count (byte 7), TID (8..15) and initial path (129..) patched into the template
    return b"".join((tpl[:_HOPS], bytes((n,)), tid.to_bytes(8, "big"), tpl[_TID + 8 : _PATH],
                     bytes(path), tpl[_PATH + n :]))  # fmt: skip
