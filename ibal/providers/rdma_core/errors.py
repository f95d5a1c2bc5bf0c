"""pyverbs failures as ibal status exceptions.

pyverbs raises ``PyverbsRDMAError`` with the errno of the failing libibverbs
call in ``error_code`` (-1 when it did not record one), ``PyverbsUserError``
for arguments it refuses itself, and plain ``OverflowError``/``TypeError`` when
a Python value does not fit the C field.  :func:`status_for_errno` is the
generic table; each verb passes overrides where an errno means something more
precise for it (``EINVAL`` from ``ibv_resize_cq`` below the number of queued
entries is ``Overflow``, ``EINVAL`` from ``ibv_dereg_mr`` with windows bound is
``ResourceBusy``, ...).
"""

from __future__ import annotations

import errno as E
import os
import re
from collections.abc import Mapping

from ibal.status import (
    Canceled,
    Error,
    IbError,
    InsufficientResources,
    Interrupted,
    InvalidGid,
    InvalidParameter,
    InvalidPermission,
    InvalidSetting,
    NotFound,
    Overflow,
    ResourceBusy,
    Status,
    Timeout,
    Unsupported,
)

ERRNO_STATUS: dict[int, type[IbError]] = {
    E.EINVAL: InvalidParameter,
    E.EFAULT: InvalidParameter,
    E.E2BIG: InvalidParameter,
    E.ERANGE: InvalidSetting,
    E.ENOMEM: InsufficientResources,
    E.ENOSPC: InsufficientResources,
    E.EAGAIN: InsufficientResources,
    E.EMFILE: InsufficientResources,
    E.ENFILE: InsufficientResources,
    E.ENOBUFS: InsufficientResources,
    E.EBUSY: ResourceBusy,
    E.EEXIST: ResourceBusy,
    E.EOPNOTSUPP: Unsupported,
    E.ENOSYS: Unsupported,
    E.EPROTONOSUPPORT: Unsupported,
    E.EAFNOSUPPORT: Unsupported,
    E.EACCES: InvalidPermission,
    E.EPERM: InvalidPermission,
    E.ENOENT: NotFound,
    E.ENODEV: NotFound,
    E.ENXIO: NotFound,
    E.ENODATA: NotFound,
    E.EOVERFLOW: Overflow,
    E.ETIMEDOUT: Timeout,
    E.EINTR: Interrupted,
    E.ECANCELED: Canceled,
    E.EIO: Error,
    # RoCE: no route from the source GID's netdev to the destination GID.
    E.ENETUNREACH: InvalidGid,
    E.EHOSTUNREACH: InvalidGid,
    E.EADDRNOTAVAIL: InvalidGid,
}

_ERRNO_IN_MESSAGE = re.compile(r"Errno: (-?\d+)")


def errno_of(exc: BaseException) -> int | None:
    """The errno a pyverbs exception carries, or None."""
    code = getattr(exc, "error_code", None)
    if isinstance(code, int) and code not in (0, -1):
        return abs(code)  # some pyverbs calls pass a negated errno
    m = _ERRNO_IN_MESSAGE.search(str(exc))
    return abs(int(m.group(1))) if m else None


def status_for_errno(
    err: int | None, overrides: Mapping[int, type[IbError]] | None = None
) -> type[IbError]:
    """The exception class for ``err``; unknown or missing errno gives ``Error``."""
    if err is None:
        return Error
    if overrides and err in overrides:
        return overrides[err]
    return ERRNO_STATUS.get(err, Error)


def translate(
    exc: BaseException,
    what: str,
    overrides: Mapping[int, type[IbError]] | None = None,
) -> IbError:
    """The ibal exception for a failure of ``what`` (to raise ``from exc``)."""
    if isinstance(exc, IbError):
        return exc
    if isinstance(exc, (OverflowError, TypeError, ValueError)):
        return InvalidParameter(f"{what}: {exc}")
    if type(exc).__name__ == "PyverbsUserError":
        return InvalidParameter(f"{what}: {exc}")
    err = errno_of(exc)
    cls = status_for_errno(err, overrides)
    name = E.errorcode.get(err, str(err)) if err is not None else "no errno"
    text = os.strerror(err) if err is not None else str(exc)
    return cls(f"{what} failed: {name} ({text})")


def status_of(exc: BaseException, overrides: Mapping[int, type[IbError]] | None = None) -> Status:
    """The :class:`Status` :func:`translate` would give."""
    return translate(exc, "", overrides).status
