"""errno -> ibal status mapping of pyverbs failures."""

from __future__ import annotations

import errno

import pytest

from ibal.providers.rdma_core.errors import (
    ERRNO_STATUS,
    errno_of,
    status_for_errno,
    status_of,
    translate,
)
from ibal.status import (
    Error,
    InsufficientResources,
    InvalidGid,
    InvalidParameter,
    InvalidPermission,
    NotFound,
    Overflow,
    ResourceBusy,
    Status,
    Unsupported,
)


class PyverbsRDMAError(Exception):
    """Shaped like pyverbs' own: errno in ``error_code``, -1 when unknown."""

    def __init__(self, msg: str, error_code: int = -1) -> None:
        if error_code != -1:
            msg = f"{msg}. Errno: {error_code}, {errno.errorcode[error_code]}"
        super().__init__(msg)
        self.error_code = error_code


class PyverbsUserError(Exception):
    pass


@pytest.mark.parametrize(
    ("err", "cls"),
    [
        (errno.EINVAL, InvalidParameter),
        (errno.ENOMEM, InsufficientResources),
        (errno.EAGAIN, InsufficientResources),
        (errno.EBUSY, ResourceBusy),
        (errno.EOPNOTSUPP, Unsupported),
        (errno.ENOSYS, Unsupported),
        (errno.EACCES, InvalidPermission),
        (errno.EPERM, InvalidPermission),
        (errno.ENOENT, NotFound),
        (errno.ENODEV, NotFound),
        (errno.EOVERFLOW, Overflow),
        (errno.ENETUNREACH, InvalidGid),
    ],
)
def test_errno_table(err: int, cls: type) -> None:
    assert status_for_errno(err) is cls
    exc = translate(PyverbsRDMAError("Failed to do it", err), "ibv_do_it")
    assert type(exc) is cls
    assert "ibv_do_it failed" in str(exc)
    assert errno.errorcode[err] in str(exc)


def test_unknown_and_missing_errno_is_error() -> None:
    assert status_for_errno(None) is Error
    assert status_for_errno(9999) is Error
    assert type(translate(PyverbsRDMAError("Failed to query pkey 1 of port 1"), "q")) is Error


def test_overrides_win() -> None:
    e = PyverbsRDMAError("Failed to resize CQ", errno.EINVAL)
    assert type(translate(e, "ibv_resize_cq", {errno.EINVAL: Overflow})) is Overflow
    assert status_of(e) is Status.INVALID_PARAMETER


def test_errno_parsed_from_message_when_code_missing() -> None:
    class Bare(Exception):
        pass

    assert errno_of(Bare("Failed to dereg MR. Errno: 22, Invalid argument")) == 22
    assert errno_of(Bare("no number")) is None


def test_python_conversion_errors_are_invalid_parameter() -> None:
    assert type(translate(OverflowError("can't convert negative int"), "x")) is InvalidParameter
    assert type(translate(TypeError("an integer is required"), "x")) is InvalidParameter
    assert type(translate(PyverbsUserError("A WR needs at least one SGE"), "x")) is InvalidParameter


def test_every_mapped_status_is_an_ibal_status() -> None:
    for cls in ERRNO_STATUS.values():
        assert isinstance(cls.status, Status)


def test_negative_errno_from_pyverbs_is_normalised() -> None:
    # query_gid_table raises with the negated errno of the ioctl
    e = PyverbsRDMAError("Failed to query gid tables of the device", -1)
    e.error_code = -22
    assert errno_of(e) == errno.EINVAL
