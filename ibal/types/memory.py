"""Memory: access rights, registrations, physical and fast memory regions."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from ibal.records import record


class AccessFlags(enum.IntFlag):
    """`ib_access_t`."""

    NONE = 0
    RDMA_READ = 0x1
    RDMA_WRITE = 0x2
    ATOMIC = 0x4
    LOCAL_WRITE = 0x8
    MW_BIND = 0x10

    @property
    def is_remote(self) -> bool:
        return bool(self & (AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC))


ALL_ACCESS = (
    AccessFlags.RDMA_READ
    | AccessFlags.RDMA_WRITE
    | AccessFlags.ATOMIC
    | AccessFlags.LOCAL_WRITE
    | AccessFlags.MW_BIND
)


class MrModMask(enum.IntFlag):
    """`ib_mr_mod_t`: what re-registration changes."""

    ADDR = 0x1
    PD = 0x2
    ACCESS = 0x4


@record(frozen=True)
class MrAttr:
    """`ib_mr_attr_t`; ``pd`` is filled by the access layer."""

    local_lb: int
    local_ub: int
    remote_lb: int
    remote_ub: int
    access: AccessFlags
    lkey: int
    rkey: int
    pd: Any = None


@record(frozen=True)
class MrKeys:
    """What a registration returns: keys and the I/O virtual address assigned."""

    handle: Any
    lkey: int
    rkey: int
    vaddr: int
    length: int


@record(frozen=True)
class PhysCreate:
    """`ib_phys_create_t`: pages that are to look contiguous to the HCA.

    Each page is a writable buffer standing for a physical range; ``length``
    bytes starting ``buf_offset`` into the first page are registered.
    """

    pages: Sequence[memoryview]
    page_size: int
    length: int
    access: AccessFlags
    buf_offset: int = 0


@record(frozen=True)
class FmrCreate:
    """`mlnx_fmr_create_t`: a fast memory region's limits, fixed when it is created.

    ``max_pages`` pages of ``page_size`` bytes (a power of two; the C field is a
    shift) may be mapped at a time; ``max_maps`` maps may follow one another before
    an unmap is needed; ``access`` applies to every mapping.
    """

    max_pages: int
    max_maps: int
    page_size: int
    access: AccessFlags
