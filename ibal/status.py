"""The `ib_api_status_t` set as an enum and as a hierarchy of exceptions.

Every failing call in ibal raises a subclass of :class:`IbError` whose
``status`` is the IBAL status it stands for.  Tests and callers compare by
class or by ``status.name`` (IBAL ordinals differ between header versions).

The hierarchy groups the statuses a caller usually handles together::

    IbError
    ├── InvalidHandle          (every IB_INVALID_*_HANDLE)
    ├── ResourceError          (INSUFFICIENT_RESOURCES / _MEMORY, RESOURCE_BUSY, OVERFLOW)
    ├── InvalidArgument        (INVALID_PARAMETER, INVALID_SETTING, INVALID_PORT, ...)
    ├── StateError             (INVALID_QP_STATE, INVALID_STATE, ...)
    └── one class per remaining status (Unsupported, NotFound, Timeout, ...)
"""

from __future__ import annotations

import enum
from typing import NoReturn


class Status(enum.IntEnum):
    """`ib_api_status_t`, in the upstream (WinOFED) order, plus DUPLICATE_CA."""

    SUCCESS = 0
    INSUFFICIENT_RESOURCES = enum.auto()
    INSUFFICIENT_MEMORY = enum.auto()
    INVALID_PARAMETER = enum.auto()
    INVALID_SETTING = enum.auto()
    NOT_FOUND = enum.auto()
    TIMEOUT = enum.auto()
    CANCELED = enum.auto()
    INTERRUPTED = enum.auto()
    INVALID_PERMISSION = enum.auto()
    UNSUPPORTED = enum.auto()
    OVERFLOW = enum.auto()
    MAX_MCAST_QPS_REACHED = enum.auto()
    INVALID_QP_STATE = enum.auto()
    INVALID_APM_STATE = enum.auto()
    INVALID_PORT_STATE = enum.auto()
    INVALID_STATE = enum.auto()
    RESOURCE_BUSY = enum.auto()
    INVALID_PKEY = enum.auto()
    INVALID_LKEY = enum.auto()
    INVALID_RKEY = enum.auto()
    INVALID_MAX_WRS = enum.auto()
    INVALID_MAX_SGE = enum.auto()
    INVALID_CQ_SIZE = enum.auto()
    INVALID_SRQ_SIZE = enum.auto()
    INVALID_SERVICE_TYPE = enum.auto()
    INVALID_GID = enum.auto()
    INVALID_LID = enum.auto()
    INVALID_GUID = enum.auto()
    INVALID_GUID_MASK = enum.auto()
    INVALID_CA_HANDLE = enum.auto()
    INVALID_AV_HANDLE = enum.auto()
    INVALID_CQ_HANDLE = enum.auto()
    INVALID_QP_HANDLE = enum.auto()
    INVALID_SRQ_HANDLE = enum.auto()
    INVALID_PD_HANDLE = enum.auto()
    INVALID_MR_HANDLE = enum.auto()
    INVALID_FMR_HANDLE = enum.auto()
    INVALID_MW_HANDLE = enum.auto()
    INVALID_MCAST_HANDLE = enum.auto()
    INVALID_CALLBACK = enum.auto()
    INVALID_AL_HANDLE = enum.auto()
    INVALID_HANDLE = enum.auto()
    ERROR = enum.auto()
    REMOTE_ERROR = enum.auto()
    VERBS_PROCESSING_DONE = enum.auto()
    INVALID_WR_TYPE = enum.auto()
    QP_IN_TIMEWAIT = enum.auto()
    EE_IN_TIMEWAIT = enum.auto()
    INVALID_PORT = enum.auto()
    NOT_DONE = enum.auto()
    INVALID_INDEX = enum.auto()
    NO_MATCH = enum.auto()
    PENDING = enum.auto()
    # Not in ib_api_status_t: ib_ci.h's ib_register_ca documents it for a GUID
    # registered twice, so ibal adds it rather than overloading RESOURCE_BUSY.
    DUPLICATE_CA = enum.auto()
    UNKNOWN_ERROR = enum.auto()

    @property
    def ib_name(self) -> str:
        """The C spelling, e.g. ``IB_INVALID_QP_HANDLE``."""
        return f"IB_{self.name}"


class IbError(Exception):
    """Base of every ibal status exception; ``status`` says which one."""

    status: Status = Status.ERROR

    def __init__(self, message: str = "", *, status: Status | None = None) -> None:
        if status is not None:
            self.status = status
        super().__init__(f"{self.status.ib_name}: {message}" if message else self.status.ib_name)
        self.detail = message


class InvalidHandle(IbError):
    """A handle that is destroyed, foreign, of the wrong type or never existed."""

    status = Status.INVALID_HANDLE


class ResourceError(IbError):
    """The resource is exhausted, busy or too small."""

    status = Status.INSUFFICIENT_RESOURCES


class InvalidArgument(IbError):
    """A parameter or setting is not acceptable."""

    status = Status.INVALID_PARAMETER


class StateError(IbError):
    """The object is not in a state that allows the call."""

    status = Status.INVALID_STATE


class PostError(IbError):
    """Raised by the post verbs: ``failed_index`` is the first work request not posted.

    The work requests before it were posted (IBAL's ``pp_failed`` contract).
    """

    failed_index: int = 0


def raise_status(status: Status, message: str = "") -> NoReturn:
    """Raise the exception that stands for ``status``."""
    raise error_class(status)(message)


def error_class(status: Status) -> type[IbError]:
    """The exception class raised for ``status`` (never for SUCCESS)."""
    if status is Status.SUCCESS:
        raise ValueError("SUCCESS is not an error")
    return _CLASSES[status]


_POST_CLASSES: dict[Status, type[PostError]] = {}


def post_error(status: Status, failed_index: int, message: str = "") -> PostError:
    """A :class:`PostError` that is also an instance of ``status``'s class."""
    cls = _POST_CLASSES.get(status)
    if cls is None:
        base = error_class(status)
        cls = type(f"Post{base.__name__}", (PostError, base), {"status": status})
        _POST_CLASSES[status] = cls
    err = cls(message)
    err.failed_index = failed_index
    return err


# One class per status, so ``except ibal.status.InvalidQpHandle`` reads like the C name.


class InsufficientResources(ResourceError):
    """``IB_INSUFFICIENT_RESOURCES``."""

    status = Status.INSUFFICIENT_RESOURCES


class InsufficientMemory(ResourceError):
    """``IB_INSUFFICIENT_MEMORY``."""

    status = Status.INSUFFICIENT_MEMORY


class InvalidParameter(InvalidArgument):
    """``IB_INVALID_PARAMETER``."""

    status = Status.INVALID_PARAMETER


class InvalidSetting(InvalidArgument):
    """``IB_INVALID_SETTING``."""

    status = Status.INVALID_SETTING


class NotFound(IbError):
    """``IB_NOT_FOUND``."""

    status = Status.NOT_FOUND


class Timeout(IbError):
    """``IB_TIMEOUT``."""

    status = Status.TIMEOUT


class Canceled(IbError):
    """``IB_CANCELED``."""

    status = Status.CANCELED


class Interrupted(IbError):
    """``IB_INTERRUPTED``."""

    status = Status.INTERRUPTED


class InvalidPermission(InvalidArgument):
    """``IB_INVALID_PERMISSION``."""

    status = Status.INVALID_PERMISSION


class Unsupported(IbError):
    """``IB_UNSUPPORTED``."""

    status = Status.UNSUPPORTED


class Overflow(ResourceError):
    """``IB_OVERFLOW``."""

    status = Status.OVERFLOW


class MaxMcastQpsReached(ResourceError):
    """``IB_MAX_MCAST_QPS_REACHED``."""

    status = Status.MAX_MCAST_QPS_REACHED


class InvalidQpState(StateError):
    """``IB_INVALID_QP_STATE``."""

    status = Status.INVALID_QP_STATE


class InvalidApmState(StateError):
    """``IB_INVALID_APM_STATE``."""

    status = Status.INVALID_APM_STATE


class InvalidPortState(StateError):
    """``IB_INVALID_PORT_STATE``."""

    status = Status.INVALID_PORT_STATE


class InvalidState(StateError):
    """``IB_INVALID_STATE``."""

    status = Status.INVALID_STATE


class ResourceBusy(ResourceError):
    """``IB_RESOURCE_BUSY``."""

    status = Status.RESOURCE_BUSY


class InvalidPkey(InvalidArgument):
    """``IB_INVALID_PKEY``."""

    status = Status.INVALID_PKEY


class InvalidLkey(InvalidArgument):
    """``IB_INVALID_LKEY``."""

    status = Status.INVALID_LKEY


class InvalidRkey(InvalidArgument):
    """``IB_INVALID_RKEY``."""

    status = Status.INVALID_RKEY


class InvalidMaxWrs(InvalidArgument):
    """``IB_INVALID_MAX_WRS``."""

    status = Status.INVALID_MAX_WRS


class InvalidMaxSge(InvalidArgument):
    """``IB_INVALID_MAX_SGE``."""

    status = Status.INVALID_MAX_SGE


class InvalidCqSize(InvalidArgument):
    """``IB_INVALID_CQ_SIZE``."""

    status = Status.INVALID_CQ_SIZE


class InvalidSrqSize(InvalidArgument):
    """``IB_INVALID_SRQ_SIZE``."""

    status = Status.INVALID_SRQ_SIZE


class InvalidServiceType(InvalidArgument):
    """``IB_INVALID_SERVICE_TYPE``."""

    status = Status.INVALID_SERVICE_TYPE


class InvalidGid(InvalidArgument):
    """``IB_INVALID_GID``."""

    status = Status.INVALID_GID


class InvalidLid(InvalidArgument):
    """``IB_INVALID_LID``."""

    status = Status.INVALID_LID


class InvalidGuid(InvalidArgument):
    """``IB_INVALID_GUID``."""

    status = Status.INVALID_GUID


class InvalidGuidMask(InvalidArgument):
    """``IB_INVALID_GUID_MASK``."""

    status = Status.INVALID_GUID_MASK


class InvalidCaHandle(InvalidHandle):
    """``IB_INVALID_CA_HANDLE``."""

    status = Status.INVALID_CA_HANDLE


class InvalidAvHandle(InvalidHandle):
    """``IB_INVALID_AV_HANDLE``."""

    status = Status.INVALID_AV_HANDLE


class InvalidCqHandle(InvalidHandle):
    """``IB_INVALID_CQ_HANDLE``."""

    status = Status.INVALID_CQ_HANDLE


class InvalidQpHandle(InvalidHandle):
    """``IB_INVALID_QP_HANDLE``."""

    status = Status.INVALID_QP_HANDLE


class InvalidSrqHandle(InvalidHandle):
    """``IB_INVALID_SRQ_HANDLE``."""

    status = Status.INVALID_SRQ_HANDLE


class InvalidPdHandle(InvalidHandle):
    """``IB_INVALID_PD_HANDLE``."""

    status = Status.INVALID_PD_HANDLE


class InvalidMrHandle(InvalidHandle):
    """``IB_INVALID_MR_HANDLE``."""

    status = Status.INVALID_MR_HANDLE


class InvalidFmrHandle(InvalidHandle):
    """``IB_INVALID_FMR_HANDLE``."""

    status = Status.INVALID_FMR_HANDLE


class InvalidMwHandle(InvalidHandle):
    """``IB_INVALID_MW_HANDLE``."""

    status = Status.INVALID_MW_HANDLE


class InvalidMcastHandle(InvalidHandle):
    """``IB_INVALID_MCAST_HANDLE``."""

    status = Status.INVALID_MCAST_HANDLE


class InvalidCallback(InvalidArgument):
    """``IB_INVALID_CALLBACK``."""

    status = Status.INVALID_CALLBACK


class InvalidAlHandle(InvalidHandle):
    """``IB_INVALID_AL_HANDLE``."""

    status = Status.INVALID_AL_HANDLE


class Error(IbError):
    """``IB_ERROR``."""

    status = Status.ERROR


class RemoteError(IbError):
    """``IB_REMOTE_ERROR``."""

    status = Status.REMOTE_ERROR


class VerbsProcessingDone(IbError):
    """``IB_VERBS_PROCESSING_DONE``."""

    status = Status.VERBS_PROCESSING_DONE


class InvalidWrType(InvalidArgument):
    """``IB_INVALID_WR_TYPE``."""

    status = Status.INVALID_WR_TYPE


class QpInTimewait(IbError):
    """``IB_QP_IN_TIMEWAIT``."""

    status = Status.QP_IN_TIMEWAIT


class EeInTimewait(IbError):
    """``IB_EE_IN_TIMEWAIT``."""

    status = Status.EE_IN_TIMEWAIT


class InvalidPort(InvalidArgument):
    """``IB_INVALID_PORT``."""

    status = Status.INVALID_PORT


class NotDone(IbError):
    """``IB_NOT_DONE``."""

    status = Status.NOT_DONE


class InvalidIndex(InvalidArgument):
    """``IB_INVALID_INDEX``."""

    status = Status.INVALID_INDEX


class NoMatch(InvalidArgument):
    """``IB_NO_MATCH``."""

    status = Status.NO_MATCH


class Pending(IbError):
    """``IB_PENDING``."""

    status = Status.PENDING


class DuplicateCa(IbError):
    """``IB_DUPLICATE_CA``."""

    status = Status.DUPLICATE_CA


class UnknownError(IbError):
    """``IB_UNKNOWN_ERROR``."""

    status = Status.UNKNOWN_ERROR


_CLASSES: dict[Status, type[IbError]] = {
    cls.status: cls
    for cls in (
        InvalidHandle,
        InsufficientResources,
        InsufficientMemory,
        InvalidParameter,
        InvalidSetting,
        NotFound,
        Timeout,
        Canceled,
        Interrupted,
        InvalidPermission,
        Unsupported,
        Overflow,
        MaxMcastQpsReached,
        InvalidQpState,
        InvalidApmState,
        InvalidPortState,
        InvalidState,
        ResourceBusy,
        InvalidPkey,
        InvalidLkey,
        InvalidRkey,
        InvalidMaxWrs,
        InvalidMaxSge,
        InvalidCqSize,
        InvalidSrqSize,
        InvalidServiceType,
        InvalidGid,
        InvalidLid,
        InvalidGuid,
        InvalidGuidMask,
        InvalidCaHandle,
        InvalidAvHandle,
        InvalidCqHandle,
        InvalidQpHandle,
        InvalidSrqHandle,
        InvalidPdHandle,
        InvalidMrHandle,
        InvalidFmrHandle,
        InvalidMwHandle,
        InvalidMcastHandle,
        InvalidCallback,
        InvalidAlHandle,
        Error,
        RemoteError,
        VerbsProcessingDone,
        InvalidWrType,
        QpInTimewait,
        EeInTimewait,
        InvalidPort,
        NotDone,
        InvalidIndex,
        NoMatch,
        Pending,
        DuplicateCa,
        UnknownError,
    )
}

__all__ = [
    "Canceled",
    "DuplicateCa",
    "EeInTimewait",
    "Error",
    "IbError",
    "InsufficientMemory",
    "InsufficientResources",
    "Interrupted",
    "InvalidAlHandle",
    "InvalidApmState",
    "InvalidArgument",
    "InvalidAvHandle",
    "InvalidCaHandle",
    "InvalidCallback",
    "InvalidCqHandle",
    "InvalidCqSize",
    "InvalidFmrHandle",
    "InvalidGid",
    "InvalidGuid",
    "InvalidGuidMask",
    "InvalidHandle",
    "InvalidIndex",
    "InvalidLid",
    "InvalidLkey",
    "InvalidMaxSge",
    "InvalidMaxWrs",
    "InvalidMcastHandle",
    "InvalidMrHandle",
    "InvalidMwHandle",
    "InvalidParameter",
    "InvalidPdHandle",
    "InvalidPermission",
    "InvalidPkey",
    "InvalidPort",
    "InvalidPortState",
    "InvalidQpHandle",
    "InvalidQpState",
    "InvalidRkey",
    "InvalidServiceType",
    "InvalidSetting",
    "InvalidSrqHandle",
    "InvalidSrqSize",
    "InvalidState",
    "InvalidWrType",
    "MaxMcastQpsReached",
    "NoMatch",
    "NotDone",
    "NotFound",
    "Overflow",
    "Pending",
    "PostError",
    "QpInTimewait",
    "RemoteError",
    "ResourceBusy",
    "ResourceError",
    "StateError",
    "Status",
    "Timeout",
    "UnknownError",
    "Unsupported",
    "VerbsProcessingDone",
    "error_class",
    "post_error",
    "raise_status",
]
