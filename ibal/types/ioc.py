"""I/O units and controllers: service entries, IOC profiles, IOU and IOC records (checked)."""

from __future__ import annotations

from ibal.records import record
from ibal.status import InvalidParameter
from ibal.types.base import is_int

SVC_NAME_SIZE = 40
"""Bytes of an ``ib_svc_entry_t`` name (IBA 16.3.3.5 ServiceEntries: 40-byte names)."""
IOC_ID_STRING_SIZE = 64
"""Bytes of an IOC profile's ``id_string``."""
NODE_DESC_SIZE = 64
"""Bytes of a node description (``IB_NODE_DESCRIPTION_SIZE``)."""
MAX_SVC_ENTRIES = 0xFF


def _check_uint(owner: str, name: str, value: object, bits: int) -> None:
    if not is_int(value) or not 0 <= value < 1 << bits:
        raise InvalidParameter(f"{owner}.{name} must be an unsigned {bits}-bit int, not {value!r}")


def _check_text(owner: str, name: str, value: object, size: int) -> None:
    if not isinstance(value, str) or len(value.encode()) > size:
        raise InvalidParameter(f"{owner}.{name} must be a str of at most {size} bytes (UTF-8)")


@record(frozen=True)
class SvcEntry:
    """``ib_svc_entry_t``: one service of an I/O controller (name of at most 40 bytes, 64-bit ID).

    ``InvalidParameter`` for a longer name or an ID that is not 64 bits.
    """

    name: str
    id: int

    def __post_init__(self) -> None:
        _check_text("SvcEntry", "name", self.name, SVC_NAME_SIZE)
        _check_uint("SvcEntry", "id", self.id, 64)


_PROFILE_BITS = {
    "ioc_guid": 64, "vend_id": 24, "dev_id": 32, "dev_version": 16, "subsys_vend_id": 24,
    "subsys_id": 32, "io_class": 16, "io_subclass": 16, "protocol": 16, "protocol_ver": 16,
    "send_msg_depth": 16, "rdma_read_depth": 8, "send_msg_size": 32, "rdma_size": 32,
    "ctrl_ops_cap": 8, "num_svc_entries": 8,
}  # fmt: skip


@record(frozen=True, kw_only=True)
class IocProfile:
    """``ib_ioc_profile_t``: an I/O controller's IOControllerProfile (IBA 16.3.3.4).

    Field widths are the wire's (``vend_id`` 24 bits, ...); ``InvalidParameter``
    for a value that does not fit or an ``id_string`` over 64 bytes.
    ``num_svc_entries`` is the number of service entries the controller
    exports (the DM agent fills it from the IOC's entries).
    """

    ioc_guid: int
    vend_id: int = 0
    dev_id: int = 0
    dev_version: int = 0
    subsys_vend_id: int = 0
    subsys_id: int = 0
    io_class: int = 0
    io_subclass: int = 0
    protocol: int = 0
    protocol_ver: int = 0
    send_msg_depth: int = 0
    rdma_read_depth: int = 0
    send_msg_size: int = 0
    rdma_size: int = 0
    ctrl_ops_cap: int = 0
    num_svc_entries: int = 0
    id_string: str = ""

    def __post_init__(self) -> None:
        for name, bits in _PROFILE_BITS.items():
            _check_uint("IocProfile", name, getattr(self, name), bits)
        _check_text("IocProfile", "id_string", self.id_string, IOC_ID_STRING_SIZE)


@record(frozen=True, kw_only=True)
class IouInfo:
    """An I/O unit as ``ib_pnp_iou_rec_t`` reports it.

    ``guid`` is the IOU's (its node's) GUID, ``ca_guid`` the local CA it is
    reached through; ``desc`` is the node description (at most 64 bytes).
    """

    guid: int
    ca_guid: int = 0
    chassis_guid: int = 0
    slot: int = 0
    vend_id: int = 0
    dev_id: int = 0
    revision: int = 0
    desc: str = ""

    def __post_init__(self) -> None:
        for name, bits in (("guid", 64), ("ca_guid", 64), ("chassis_guid", 64), ("slot", 8),
                           ("vend_id", 32), ("dev_id", 16), ("revision", 32)):
            _check_uint("IouInfo", name, getattr(self, name), bits)
        _check_text("IouInfo", "desc", self.desc, NODE_DESC_SIZE)


@record(frozen=True, kw_only=True)
class IocInfo:
    """``ib_ioc_info_t`` with the service entries: an IOC, the I/O unit it sits in, its services.

    ``slot`` is the IOC's controller slot in the IOU (1-based, IBA 16.3.3.3);
    ``chassis_slot`` the IOU's slot in its chassis.
    """

    profile: IocProfile
    iou_guid: int = 0
    chassis_guid: int = 0
    chassis_slot: int = 0
    slot: int = 0
    svc_entries: tuple[SvcEntry, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.profile, IocProfile):
            raise InvalidParameter("IocInfo.profile must be an IocProfile")
        for name, bits in (("iou_guid", 64), ("chassis_guid", 64), ("chassis_slot", 8),
                           ("slot", 16)):
            _check_uint("IocInfo", name, getattr(self, name), bits)
        if not isinstance(self.svc_entries, tuple) or not all(
                isinstance(e, SvcEntry) for e in self.svc_entries):
            raise InvalidParameter("IocInfo.svc_entries must be a tuple of SvcEntry")
        if len(self.svc_entries) > MAX_SVC_ENTRIES:
            raise InvalidParameter(f"an IOC has at most {MAX_SVC_ENTRIES} service entries")

    @property
    def ioc_guid(self) -> int:
        return self.profile.ioc_guid
