"""Where a MAD goes: :class:`PortId` (libibmad's ``ib_portid_t``), the tools' target
syntax, and the AL address a request to a port id takes."""

from __future__ import annotations

import functools
from typing import Any

from ibal.records import record

__all__ = ["PortId", "mad_addr", "parse_dr_path", "parse_portid"]


@record(frozen=True)
class PortId:
    """A destination like libibmad's ``ib_portid_t``: a LID, or a directed-route path.

    ``dr_path`` lists the out ports of the hops (``()`` is the local port);
    ``dr_slid``/``dr_dlid`` are the DR SMP's LID-routed ends (0xFFFF: none).
    """

    lid: int = 0
    dr_path: tuple[int, ...] | None = None
    dr_slid: int = 0xFFFF
    dr_dlid: int = 0xFFFF

    def __post_init__(self) -> None:
        if self.dr_path is None and not 0 < self.lid < 0xFFFF:
            raise ValueError(f"LID {self.lid} is not a unicast LID")
        if self.dr_path is not None:
            if len(self.dr_path) > 63:
                raise ValueError("a directed route has at most 63 hops")
            if any(not 1 <= p <= 254 for p in self.dr_path):
                raise ValueError(f"directed route {self.dr_path}: ports are 1..254")

    @property
    def directed(self) -> bool:
        return self.dr_path is not None

    def __str__(self) -> str:
        """How infiniband-diags names it (``Lid 2``, ``DR path slid 65535; dlid 65535; 0,1``)."""
        from ibal.wire.mad.dump import portid_str

        if self.dr_path is None:
            return portid_str(self.lid)
        return portid_str(0, self.dr_path, self.dr_slid, self.dr_dlid)


def parse_dr_path(text: str) -> tuple[int, ...]:
    """``"0,1,3"`` -> ``(1, 3)``: the first entry is the local port (must be 0)."""
    try:
        hops = [int(x, 0) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise ValueError(f"{text!r} is not a directed route like 0,1,3") from None
    if not hops or hops[0] != 0:
        raise ValueError(f"directed route {text!r} must start at port 0")
    return tuple(hops[1:])


def parse_portid(text: str, *, directed: bool = False) -> PortId:
    """A target as the tools take it: a LID (decimal or 0x..), or with ``directed`` a DR path."""
    if directed:
        return PortId(dr_path=parse_dr_path(text))
    try:
        lid = int(text, 0)
    except ValueError:
        raise ValueError(f"{text!r} is not a LID") from None
    return PortId(lid)


def mad_addr(to: PortId, qp: int) -> Any:
    """The AL address (a shared :class:`~ibal.types.MadAddr`) a MAD to ``to`` on QP ``qp`` takes."""
    if to.directed:  # to the permissive LID, or LID-routed to where the directed part starts
        return _lid_addr(to.lid if to.dr_slid != 0xFFFF and to.lid else 0xFFFF, 0)
    return _lid_addr(to.lid, qp)


@functools.lru_cache(maxsize=4096)
def _lid_addr(lid: int, qp: int) -> Any:
    """One (frozen) address per LID and QP: a sweep sends thousands of SMPs to one."""
    from ibal.types import QP1_WELL_KNOWN_QKEY, MadAddr

    if qp == 0:
        return MadAddr(remote_qp=0, remote_qkey=0, dlid=lid)
    return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=lid)
