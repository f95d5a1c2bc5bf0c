"""The mock CA's subnet management agent, reached through ``local_mad``.

It answers SubnGet (and a few SubnSet) SMPs, LID-routed (class 0x01) or
directed-route (class 0x81), for NodeDescription, NodeInfo, GUIDInfo, PortInfo
and P_KeyTable, with the layouts of IBA vol. 1 chapter 14.  Anything else gets
a GetResp carrying the matching MAD status code.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from ibal.types import MAD_SIZE, AsyncEvent, LinkState, Mtu

if TYPE_CHECKING:
    from ibal.providers.mock.ca import MockCa
    from ibal.providers.mock.topology import MockPort

CLASS_SUBN_LID = 0x01
CLASS_SUBN_DR = 0x81
METHOD_GET = 0x01
METHOD_SET = 0x02
METHOD_GET_RESP = 0x81

ATTR_NODE_DESC = 0x0010
ATTR_NODE_INFO = 0x0011
ATTR_GUID_INFO = 0x0014
ATTR_PORT_INFO = 0x0015
ATTR_PKEY_TABLE = 0x0016

STATUS_BAD_VERSION = 0x0004
STATUS_METHOD = 0x0008
STATUS_METHOD_ATTR = 0x000C
STATUS_INVALID_FIELD = 0x001C
DR_DIRECTION = 0x8000

SMP_DATA = 64
PKEY_TABLE_CAP = 64

_SPEED_CODES = {"2.5 Gbps": 1, "5.0 Gbps": 2, "10.0 Gbps": 4}


def node_info(ca: MockCa, port: MockPort) -> bytes:
    ni = bytearray(40)
    ni[0] = 1  # BaseVersion
    ni[1] = 1  # ClassVersion
    ni[2] = 1  # NodeType: channel adapter
    ni[3] = len(ca.ports)
    struct.pack_into(">QQQ", ni, 4, ca.system_image_guid, ca.guid, port.guid)
    struct.pack_into(">HHI", ni, 28, PKEY_TABLE_CAP, ca.attr_device_id, ca.attr_revision)
    ni[36] = port.num
    ni[37:40] = (ca.attr_vendor_id & 0xFFFFFF).to_bytes(3, "big")
    return bytes(ni)


def port_info(ca: MockCa, port: MockPort) -> bytes:
    pi = bytearray(64)
    fab = ca.fabric
    active = port.state is LinkState.ACTIVE
    struct.pack_into(">QQHHI", pi, 0, 0, port.subnet_prefix, port.lid, fab.sm_lid, int(port.cap))
    pi[28] = port.num
    pi[29] = 0x02  # LinkWidthEnabled: 4X
    pi[30] = 0x03  # LinkWidthSupported: 1X, 4X
    pi[31] = 0x02  # LinkWidthActive: 4X
    pi[32] = (0x7 << 4) | int(port.state)  # LinkSpeedSupported | PortState
    pi[33] = ((5 if active else 2) << 4) | 2  # PortPhysicalState (LinkUp/Polling) | default
    pi[34] = port.lmc & 0x7
    pi[35] = (_SPEED_CODES["10.0 Gbps"] << 4) | 0x7  # LinkSpeedActive | LinkSpeedEnabled
    pi[36] = (int(port.max_mtu) << 4) | 0  # NeighborMTU | MasterSMSL
    pi[37] = (1 << 4) | (port.init_type & 0xF)  # VLCap VL0 | InitType
    pi[41] = int(Mtu.MTU_4096)  # InitTypeReply 0 | MTUCap
    pi[42] = (7 << 5) | 0x10  # VLStallCount | HOQLife
    pi[43] = (1 << 4) | 0x0C  # OperationalVLs | partition enforcement in/out
    struct.pack_into(">HHH", pi, 44, 0, port.pkey_violations, port.qkey_violations)
    pi[50] = 1  # GUIDCap
    pi[51] = fab.subnet_timeout & 0x1F
    pi[52] = 0x10  # RespTimeValue
    return bytes(pi)


def process(ca: MockCa, port: MockPort, mad: bytes) -> bytes:
    """The response MAD (256 bytes) for ``mad`` arriving on ``port``."""
    out = bytearray(mad)
    base_ver, mgmt_class, class_ver, method = out[0], out[1], out[2], out[3]
    attr_id, attr_mod = struct.unpack_from(">H2xI", out, 16)
    dr = mgmt_class == CLASS_SUBN_DR
    status = 0
    data: bytes | None = None
    if mgmt_class not in (CLASS_SUBN_LID, CLASS_SUBN_DR) or base_ver != 1 or class_ver != 1:
        status = STATUS_BAD_VERSION
    elif method not in (METHOD_GET, METHOD_SET):
        status = STATUS_METHOD
    else:
        status, data = _attribute(ca, port, method, attr_id, attr_mod, bytes(out[64:128]))
    out[3] = METHOD_GET_RESP if method in (METHOD_GET, METHOD_SET) else method | 0x80
    struct.pack_into(">H", out, 4, status | (DR_DIRECTION if dr else 0))
    if data is not None:
        out[SMP_DATA : SMP_DATA + 64] = data.ljust(64, b"\0")
    return bytes(out[:MAD_SIZE])


def _attribute(
    ca: MockCa, port: MockPort, method: int, attr_id: int, attr_mod: int, payload: bytes
) -> tuple[int, bytes | None]:
    if attr_id == ATTR_NODE_DESC:
        if method != METHOD_GET:
            return STATUS_METHOD_ATTR, None
        return 0, ca.description.encode()[:64]
    if attr_id == ATTR_NODE_INFO:
        if method != METHOD_GET:
            return STATUS_METHOD_ATTR, None
        return 0, node_info(ca, port)
    if attr_id == ATTR_GUID_INFO:
        if method != METHOD_GET:
            return STATUS_METHOD_ATTR, None
        if attr_mod != 0:
            return STATUS_INVALID_FIELD, None
        return 0, port.guid.to_bytes(8, "big")
    if attr_id == ATTR_PORT_INFO:
        target = port if attr_mod == 0 else ca.port_or_none(attr_mod)
        if target is None:
            return STATUS_INVALID_FIELD, None
        if method == METHOD_SET:
            _set_port_info(ca, target, payload)
        return 0, port_info(ca, target)
    if attr_id == ATTR_PKEY_TABLE:
        if method != METHOD_GET:
            return STATUS_METHOD_ATTR, None
        block = attr_mod & 0xFFFF
        if block * 32 >= PKEY_TABLE_CAP:
            return STATUS_INVALID_FIELD, None
        keys = port.pkeys[block * 32 : block * 32 + 32]
        return 0, b"".join(k.to_bytes(2, "big") for k in keys)
    return STATUS_INVALID_FIELD, None


def _set_port_info(ca: MockCa, port: MockPort, pi: bytes) -> None:
    """Apply what an SM may set and the mock models: LID, PortState, ClientReregister."""
    fab = ca.fabric
    lid = struct.unpack_from(">H", pi, 16)[0]
    if lid and lid != port.lid:
        fab.set_lid_locked(port, lid)
    state = pi[32] & 0xF
    if state == LinkState.DOWN and port.state is LinkState.ACTIVE:
        fab.set_port_link_locked(port, False)
    elif state == LinkState.ACTIVE and port.state is not LinkState.ACTIVE and port.link is not None:
        fab.set_port_link_locked(port, True)
    if pi[51] & 0x80:
        fab.engine.port_event(port, AsyncEvent.CLIENT_REREGISTER)
