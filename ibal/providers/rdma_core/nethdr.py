"""Which network header a UD receive's 40-byte GRH area holds (``Wc.network_header``).

The kernel knows it (``IB_WC_WITH_NETWORK_HDR_TYPE``) but ``ibv_wc`` does not
carry it, so, as libibverbs' ``ibv_init_ah_from_wc`` does, the provider looks
at the area itself: RoCE v2 over IPv4 leaves 20 zero bytes and an IPv4 header
there; an IPv6 header and an IBA GRH both start with IP version 6 and are told
apart by the type of the destination GID (this port's GID) in the table.

:class:`ReceiveAreas` remembers where each posted UD receive's area is (a
receive queue completes in posting order) and reads it only through the
registered region's own buffer, so a region deregistered meanwhile is never
read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from typing import Any

from ibal.types import NetworkHeader, RecvWr

GRH_AREA = 40

Area = tuple[int, int, int]
"""(consumer wr_id, address, lkey) of a receive's first SGE."""


def classify(area: bytes, roce_v2_gids: Container[bytes], any_v2: bool) -> NetworkHeader | None:
    """The header in a 40-byte GRH area of a RoCE port, ``None`` if it is neither.

    ``roce_v2_gids``: the port's RoCE v2 GIDs (16 bytes each); ``any_v2``:
    whether the port has any (for multicast destinations, which are not in
    the table).
    """
    if len(area) < GRH_AREA:
        return None
    if not any(area[:20]) and area[20] >> 4 == 4:
        return NetworkHeader.IPV4
    if area[0] >> 4 != 6:
        return None
    dgid = bytes(area[24:40])
    if dgid in roce_v2_gids or (dgid[0] == 0xFF and any_v2):
        return NetworkHeader.IPV6
    return NetworkHeader.IB_GRH


class ReceiveAreas:
    """The GRH areas of posted UD receives, per QP, and the regions they lie in."""

    def __init__(self) -> None:
        self._by_qp: dict[int, deque[Area]] = {}
        self.regions: dict[int, Any] = {}
        """lkey -> the provider's MR object (``alive``, ``buffer``, ``vaddr``, ``length``)."""

    def add_qp(self, qpn: int) -> None:
        self._by_qp[qpn] = deque()

    def drop_qp(self, qpn: int) -> None:
        self._by_qp.pop(qpn, None)

    def reset(self, qpn: int) -> None:
        """The QP went to RESET: its receives are gone."""
        q = self._by_qp.get(qpn)
        if q is not None:
            q.clear()

    def posted(self, qpn: int, wrs: Sequence[RecvWr]) -> None:
        """``wrs`` were posted to ``qpn``'s receive queue, in this order."""
        q = self._by_qp.get(qpn)
        if q is None:
            return
        for wr in wrs:
            sgl = wr.sg_list
            if sgl and sgl[0].length >= GRH_AREA:
                q.append((wr.wr_id, sgl[0].addr, sgl[0].lkey))
            else:
                q.append((wr.wr_id, 0, 0))

    def completed(self, qpn: int, wr_id: int) -> bytes | None:
        """The area of ``qpn``'s oldest receive, which just completed as ``wr_id``.

        A mismatch (a completion queued before a RESET) forgets the queue
        rather than guess.
        """
        q = self._by_qp.get(qpn)
        if not q:
            return None
        want, addr, lkey = q.popleft()
        if want != wr_id:
            q.clear()
            return None
        if not addr:
            return None
        mr = self.regions.get(lkey)
        if mr is None or not mr.alive or mr.buffer is None:
            return None
        off = addr - mr.vaddr
        if off < 0 or off + GRH_AREA > mr.length:
            return None
        return bytes(mr.buffer.cast("B")[off : off + GRH_AREA])


__all__ = ["GRH_AREA", "ReceiveAreas", "classify"]
