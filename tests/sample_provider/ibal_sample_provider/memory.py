"""Memory regions: how the provider reaches consumer memory.

``register_mr`` hands the provider a ``memoryview`` of the consumer's buffer and
the virtual address the consumer uses for it.  From then on, work requests name
memory by ``(key, address, length)``: L_KEYs in the scatter/gather lists, an
R_KEY and a remote address for RDMA.  :class:`KeyTable` is the sample's memory
translation table.  It turns such a triple back into a slice of the registered
memoryview after the checks an HCA makes: the key exists, the region belongs
to the QP's protection domain, the access is allowed and the range lies inside
the region.  The provider never reaches memory any other way: no raw
addresses, no ``ctypes``.

A check that fails while a work request executes is not an exception for the
caller of ``post_send``: it becomes the status of a work completion.  That is
what :class:`Fault` carries up to the transport code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ibal.types import AccessFlags, Sge, WcStatus

from ibal_sample_provider.handles import Pd, Resource

REMOTE_ACCESS = AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC


class Fault(Exception):
    """A work request failed while executing; ``status`` goes into its completion."""

    def __init__(self, status: WcStatus) -> None:
        super().__init__(status.name)
        self.status = status


class Mr(Resource):
    """A registered region: the consumer's bytes, where they live, who may touch them."""

    def __init__(
        self, owner: object, pd: Pd, view: memoryview, vaddr: int, access: AccessFlags
    ) -> None:
        super().__init__(owner)
        self.pd = pd
        self.view = view
        self.vaddr = vaddr
        self.access = access
        self.lkey = 0
        self.rkey = 0  # stays 0 unless remote access was asked for

    @property
    def length(self) -> int:
        return len(self.view)


class KeyTable:
    """Keys to regions, and the checks every memory access goes through."""

    def __init__(self) -> None:
        self._regions: dict[int, Mr] = {}
        # Keys are never reused, so a stale key can never reach a newer region.
        # Hardware keeps a few "key variant" bits per table slot for the same
        # reason.
        self._next_key = 0x100

    def __len__(self) -> int:
        return len(self._regions)

    def add(self, mr: Mr) -> None:
        """Give ``mr`` its keys and make them valid."""
        mr.lkey = self._next_key
        mr.rkey = mr.lkey if mr.access & REMOTE_ACCESS else 0
        self._next_key += 1
        self._regions[mr.lkey] = mr

    def remove(self, mr: Mr) -> None:
        """Invalidate ``mr``'s keys: work requests that use them fault from now on."""
        del self._regions[mr.lkey]

    def translate(
        self, key: int, pd: Pd, addr: int, length: int, access: AccessFlags, fault: WcStatus
    ) -> memoryview:
        """The bytes ``[addr, addr + length)`` of the region ``key`` names, or ``Fault(fault)``."""
        mr = self._regions.get(key)
        if mr is None or mr.pd is not pd or (mr.access & access) != access:
            raise Fault(fault)
        offset = addr - mr.vaddr
        if offset < 0 or length < 0 or offset + length > mr.length:
            raise Fault(fault)
        return mr.view[offset : offset + length]

    def gather(self, sg_list: Iterable[Sge], pd: Pd) -> bytes:
        """Read a local scatter/gather list (the data a SEND or RDMA WRITE carries)."""
        return b"".join(
            self.translate(
                s.lkey, pd, s.addr, s.length, AccessFlags.NONE, WcStatus.LOCAL_PROTECTION_ERR
            )
            for s in sg_list
        )

    def scatter(self, sg_list: Sequence[Sge], pd: Pd, data: bytes, skip: int = 0) -> None:
        """Write ``data`` into a local scatter/gather list, leaving its first ``skip`` bytes.

        Every element is checked before anything is written.  ``LOCAL_LEN_ERR``
        if the list is too short.
        """
        views = [
            self.translate(
                s.lkey, pd, s.addr, s.length, AccessFlags.LOCAL_WRITE,
                WcStatus.LOCAL_PROTECTION_ERR,
            )
            for s in sg_list
        ]
        if skip + len(data) > sum(len(v) for v in views):
            raise Fault(WcStatus.LOCAL_LEN_ERR)
        position = 0  # offset of the current element within the whole list
        for view in views:
            chunk = data[max(position - skip, 0) : max(position + len(view) - skip, 0)]
            start = max(skip - position, 0)
            view[start : start + len(chunk)] = chunk
            position += len(view)
