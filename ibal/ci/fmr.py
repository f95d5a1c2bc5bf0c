"""The fast-memory-region rules of the contract (``ci_*_mlnx_fmr``), as pure checks.

A provider with native FMR verbs and the access layer's emulation over
register/deregister judge an FMR's arguments alike; one copy keeps the two
from drifting.  Pure functions: they raise :mod:`ibal.status` exceptions and
return what they validated.

The statuses follow ``ib_ci.h``'s FMR lists (``INVALID_PARAMETER``,
``INVALID_PERMISSION``, ``INSUFFICIENT_RESOURCES``) and the FMR drivers the
extension came from: a map beyond ``max_maps`` without an unmap is refused for
want of a resource (the remap budget), not for a bad argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ibal.status import InsufficientResources, InvalidParameter, InvalidPermission
from ibal.types import AccessFlags, FmrCreate

FMR_PAGE_SIZES: Final = frozenset(1 << k for k in range(12, 22))
"""The page sizes an FMR may use unless a CA says otherwise: 4 KiB to 2 MiB."""

_ALL: Final = int(
    AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE
    | AccessFlags.ATOMIC | AccessFlags.MW_BIND
)
_NEEDS_LOCAL_WRITE: Final = int(AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)


def check_fmr_create(
    create: object, max_pages: int, page_sizes: frozenset[int] = FMR_PAGE_SIZES
) -> FmrCreate:
    """``alloc_fmr``'s request against a CA that maps at most ``max_pages`` pages."""
    if not isinstance(create, FmrCreate):
        raise InvalidParameter("an FmrCreate is required")
    for name in ("max_pages", "max_maps", "page_size"):
        value = getattr(create, name)
        if type(value) is not int or value < 1:
            raise InvalidParameter(f"{name} must be a positive int, got {value!r}")
    if create.page_size not in page_sizes:
        raise InvalidParameter(f"page size {create.page_size} not supported")
    if create.max_pages > max_pages:
        raise InvalidParameter(f"max_pages {create.max_pages} above the CA's {max_pages}")
    acc: object = create.access
    if not isinstance(acc, int) or isinstance(acc, bool) or acc & ~_ALL:
        raise InvalidParameter(f"bad access flags {acc!r}")
    if int(acc) & int(AccessFlags.MW_BIND):
        raise InvalidParameter("windows are not bound to fast memory regions")
    if int(acc) & _NEEDS_LOCAL_WRITE and not int(acc) & int(AccessFlags.LOCAL_WRITE):
        raise InvalidPermission("remote write and atomic access need local write")
    return create


def check_fmr_map(create: FmrCreate, maps: int, pages: Sequence[object], vaddr: int) -> None:
    """``map_phys_fmr``: ``pages`` (after ``maps`` maps since the last unmap) at ``vaddr``.

    ``vaddr`` 0 asks the CA to choose; any other must be page aligned.
    """
    if not isinstance(pages, Sequence) or isinstance(pages, (bytes, bytearray, memoryview)):
        raise InvalidParameter("the page list must be a sequence of page buffers")
    if not pages:
        raise InvalidParameter("the page list is empty")
    if len(pages) > create.max_pages:
        raise InvalidParameter(f"{len(pages)} pages, above the FMR's max_pages {create.max_pages}")
    if type(vaddr) is not int or vaddr < 0 or vaddr + len(pages) * create.page_size > 1 << 64:
        raise InvalidParameter(f"virtual address {vaddr!r} out of range")
    if vaddr % create.page_size:
        raise InvalidParameter(f"virtual address {vaddr:#x} is not page aligned")
    if maps >= create.max_maps:
        raise InsufficientResources(
            f"the FMR was mapped {maps} times (max_maps): unmap it before mapping again"
        )
