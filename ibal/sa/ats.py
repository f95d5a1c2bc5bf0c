"""DAPL's Address Translation Service (``ib_al.h`` "ATS"): IPv4 addresses as ServiceRecords.

A host publishes "this IPv4 address is at this GID" as a ServiceRecord with
ServiceID ``ATS_SERVICE_ID``, ServiceName ``ATS_NAME`` and the address in
ServiceData8[12..15] (``ATS_IPV4_OFFSET``); anyone asks the SA for the
records of an address (a Get with ID, name and the 16 ServiceData8 bytes in
the mask) to learn the GID.  :func:`register_address` is a
:func:`~ibal.sa.service.register_service` of such a record (renewed, re-registered,
deleted with its registration); :func:`lookup_address` asks through the port's
:class:`~ibal.sa.port.SaPort`.  RoCE needs none of this: its GIDs are the IP
addresses already.
"""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any, Final

from ibal.al import AccessLayer
from ibal.sa.service import (
    RegSvcCallback,
    ServiceRecord,
    ServiceRegistration,
    register_service,
)
from ibal.status import InvalidParameter, Status, error_class
from ibal.types import Gid
from ibal.wire.mad.consts import Method, SaAttr
from ibal.wire.mad.sa import SERVICE_RECORD, component_mask

__all__ = [
    "ATS_IPV4_OFFSET",
    "ATS_NAME",
    "ATS_SERVICE_ID",
    "ats_address",
    "ats_query",
    "lookup_address",
    "register_address",
]

ATS_SERVICE_ID: Final = 0x10000CE100415453
ATS_NAME: Final = "DAPL Address Translation Service"
ATS_IPV4_OFFSET: Final = 12
"""Where the IPv4 address starts in ServiceData8 (big-endian, 4 bytes)."""
SA_NO_RECORDS: Final = 0x0300
SA_TOO_MANY: Final = 0x0400

_BY_ADDRESS: Final = component_mask(SERVICE_RECORD, [
    "service_id", "service_name", *(f"service_data8_{i}" for i in range(16))])  # fmt: skip


def _ipv4(address: object) -> IPv4Address:
    try:
        return address if isinstance(address, IPv4Address) else IPv4Address(address)
    except ValueError:
        raise InvalidParameter(f"{address!r} is not an IPv4 address") from None


def _data8(address: IPv4Address) -> dict[str, int]:
    return {f"data8_{ATS_IPV4_OFFSET + i}": b for i, b in enumerate(address.packed)}


def ats_address(record: ServiceRecord) -> IPv4Address:
    """The IPv4 address an ATS record publishes."""
    return IPv4Address(bytes(record.data8[ATS_IPV4_OFFSET : ATS_IPV4_OFFSET + 4]))


def ats_query(address: object) -> tuple[bytes, int]:
    """The ServiceRecord and component mask of the Get for ``address``'s records."""
    ip = _ipv4(address)
    data8 = [0] * 16
    data8[ATS_IPV4_OFFSET : ATS_IPV4_OFFSET + 4] = ip.packed
    rec = ServiceRecord(service_id=ATS_SERVICE_ID, service_name=ATS_NAME.encode(),
                        data8=tuple(data8))  # fmt: skip
    return rec.encode(), _BY_ADDRESS


def register_address(
    al: AccessLayer,
    address: object,
    *,
    gid: Gid | str | None = None,
    port_guid: int | None = None,
    lease: int | None = None,
    callback: RegSvcCallback | None = None,
    **kw: Any,
) -> ServiceRegistration:
    """Publish ``address`` at the SA as an ATS record for ``gid`` (default: the port's
    GID 0); the rest is :func:`~ibal.sa.service.register_service`'s."""
    ip = _ipv4(address)
    return register_service(al, name=ATS_NAME, service_id=ATS_SERVICE_ID, gid=gid,
                            port_guid=port_guid, lease=lease, data=_data8(ip),
                            callback=callback, **kw)  # fmt: skip


def lookup_address(
    al: AccessLayer,
    address: object,
    *,
    port_guid: int | None = None,
    timeout_ms: int = 1000,
    retry_cnt: int = 3,
) -> list[Gid]:
    """The GIDs the SA has ``address`` registered at (``[]``: none); blocks, not on an AL
    thread.  ``Timeout`` without an SA, ``RemoteError`` for another SA error, ``Error``
    for a GetTable answer cut short (ibsim carries no RMPP)."""
    from ibal.sa.port import SaPort

    data, mask = ats_query(address)
    sa = SaPort.open(al, port_guid)
    try:
        # A Get answers one record in one MAD; only when several hosts claim the address
        # (TOO_MANY_RECORDS) the GetTable, whose answer needs RMPP, is worth asking.
        ans = sa.request(Method.GET, SaAttr.SERVICE_RECORD, data, mask,
                         timeout_ms=timeout_ms, retry_cnt=retry_cnt).wait()  # fmt: skip
        if ans.status is Status.REMOTE_ERROR and ans.mad_status & 0x7F00 == SA_TOO_MANY:
            ans = sa.request(Method.GET_TABLE, SaAttr.SERVICE_RECORD, data, mask,
                             timeout_ms=timeout_ms, retry_cnt=retry_cnt).wait()  # fmt: skip
    finally:
        sa.close()
    if ans.status is Status.REMOTE_ERROR and ans.mad_status & 0x7F00 == SA_NO_RECORDS:
        return []
    if ans.status is not Status.SUCCESS:
        raise error_class(ans.status)(f"ATS lookup of {address}: {ans.detail}")
    return [ServiceRecord.decode(r).service_gid for r in ans.records]
