"""Numbers of the MAD world: management classes, methods, status codes, attribute IDs.

Values from IBA vol. 1 chapters 13-16 (``../shared/spec/mad-ibmf-verbs.md``).
Methods carry the R bit (``0x80``) in the response members, so a method byte
read off the wire is looked up as is.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "BASE_VERSION", "CLASS_VERSION", "DR_DIRECTION", "MAD_SIZE", "RESPONSE_BIT", "CmAttr",
    "CommonAttr", "DmAttr", "MadStatus", "Method", "MgmtClass", "PerfAttr", "SaAttr", "SmpAttr",
    "is_vendor_range1", "is_vendor_range2", "response_method",
]  # fmt: skip

MAD_SIZE: Final = 256
BASE_VERSION: Final = 1


class MgmtClass(enum.IntEnum):
    """Management class (MAD header byte 1)."""

    SUBN_LID = 0x01  # LID-routed SMP
    SUBN_ADM = 0x03  # SA
    PERF = 0x04
    BM = 0x05
    DEV_MGT = 0x06
    COMM_MGT = 0x07
    SNMP = 0x08
    CC = 0x21
    SUBN_DR = 0x81  # directed-route SMP


CLASS_VERSION: Final[dict[int, int]] = {
    MgmtClass.SUBN_LID: 1, MgmtClass.SUBN_DR: 1, MgmtClass.SUBN_ADM: 2,
    MgmtClass.PERF: 1, MgmtClass.BM: 1, MgmtClass.DEV_MGT: 1, MgmtClass.COMM_MGT: 2,
    MgmtClass.SNMP: 1, MgmtClass.CC: 2,
}  # fmt: skip


class Method(enum.IntEnum):
    """Method byte, R bit included (responses are ``0x80 |`` their request)."""

    GET = 0x01
    SET = 0x02
    SEND = 0x03
    TRAP = 0x05
    REPORT = 0x06
    TRAP_REPRESS = 0x07
    GET_TABLE = 0x12
    GET_TRACE_TABLE = 0x13
    GET_MULTI = 0x14
    DELETE = 0x15
    GET_RESP = 0x81
    REPORT_RESP = 0x86
    GET_TABLE_RESP = 0x92
    GET_MULTI_RESP = 0x94
    DELETE_RESP = 0x95


RESPONSE_BIT: Final = 0x80


def response_method(method: int) -> int:
    """The method a response to ``method`` carries (Get and Set are answered by GetResp)."""
    if method in (Method.GET, Method.SET):
        return Method.GET_RESP
    if method == Method.TRAP:
        return Method.TRAP_REPRESS
    return method | RESPONSE_BIT


def is_vendor_range1(mgmt_class: int) -> bool:
    """Vendor classes 0x09-0x0F (no OUI in the header)."""
    return 0x09 <= mgmt_class <= 0x0F


def is_vendor_range2(mgmt_class: int) -> bool:
    """Vendor classes 0x30-0x4F (an OUI follows the common header, RMPP allowed)."""
    return 0x30 <= mgmt_class <= 0x4F


class MadStatus(enum.IntEnum):
    """MAD status codes: class-independent bits 0-4, SA specific codes in bits 8-15.

    Bit 15 of a directed-route SMP's status is the D (direction) bit, not a
    status: :data:`DR_DIRECTION`.
    """

    SUCCESS = 0x0000
    BUSY = 0x0001
    REDIRECT = 0x0002
    BAD_VERSION = 0x0004  # unsupported base or class version
    METHOD_UNSUPPORTED = 0x0008
    METHOD_ATTR_UNSUPPORTED = 0x000C
    INVALID_FIELD = 0x001C  # invalid attribute or attribute modifier value
    SA_NO_RESOURCES = 0x0100
    SA_REQ_INVALID = 0x0200
    SA_NO_RECORDS = 0x0300
    SA_TOO_MANY_RECORDS = 0x0400
    SA_INVALID_GID = 0x0500
    SA_INSUFFICIENT_COMPONENTS = 0x0600
    SA_DENIED = 0x0700


STATUS_INVALID_FIELD_MASK: Final = 0x001C  # the 3-bit "invalid field" code
DR_DIRECTION: Final = 0x8000  # D bit: set in DR SMPs travelling back to the requester


class CommonAttr(enum.IntEnum):
    """Attributes every class may have."""

    CLASS_PORT_INFO = 0x0001
    NOTICE = 0x0002
    INFORM_INFO = 0x0003


class SmpAttr(enum.IntEnum):
    """Subnet management attributes (classes 0x01 and 0x81)."""

    NOTICE = 0x0002
    NODE_DESC = 0x0010
    NODE_INFO = 0x0011
    SWITCH_INFO = 0x0012
    GUID_INFO = 0x0014
    PORT_INFO = 0x0015
    PKEY_TABLE = 0x0016
    SL_TO_VL_TABLE = 0x0017
    VL_ARB_TABLE = 0x0018
    LINEAR_FT = 0x0019
    RANDOM_FT = 0x001A
    MCAST_FT = 0x001B
    SM_INFO = 0x0020
    VENDOR_DIAG = 0x0030
    LED_INFO = 0x0031
    MLNX_EXT_PORT_INFO = 0xFF90  # Mellanox's vendor range: FDR10 among its speeds


class SaAttr(enum.IntEnum):
    """Subnet administration attributes (class 0x03)."""

    CLASS_PORT_INFO = 0x0001
    NOTICE = 0x0002
    INFORM_INFO = 0x0003
    NODE_RECORD = 0x0011
    PORT_INFO_RECORD = 0x0012
    SL_TO_VL_RECORD = 0x0013
    SWITCH_INFO_RECORD = 0x0014
    LINEAR_FT_RECORD = 0x0015
    RANDOM_FT_RECORD = 0x0016
    MCAST_FT_RECORD = 0x0017
    SM_INFO_RECORD = 0x0018
    LINK_RECORD = 0x0020
    GUID_INFO_RECORD = 0x0030
    SERVICE_RECORD = 0x0031
    PKEY_TABLE_RECORD = 0x0033
    PATH_RECORD = 0x0035
    VL_ARB_RECORD = 0x0036
    MCMEMBER_RECORD = 0x0038
    TRACE_RECORD = 0x0039
    MULTIPATH_RECORD = 0x003A
    SERVICE_ASSOC_RECORD = 0x003B
    INFORM_INFO_RECORD = 0x00F3


class CmAttr(enum.IntEnum):
    """Communication management messages (class 0x07); :mod:`ibal.wire.mad.cm` has their tables."""

    CLASS_PORT_INFO = 0x0001
    REQ = 0x0010
    MRA = 0x0011
    REJ = 0x0012
    REP = 0x0013
    RTU = 0x0014
    DREQ = 0x0015
    DREP = 0x0016
    SIDR_REQ = 0x0017
    SIDR_REP = 0x0018
    LAP = 0x0019
    APR = 0x001A


class DmAttr(enum.IntEnum):
    """Device management attributes (class 0x06); :mod:`ibal.wire.mad.dm` has their tables."""

    CLASS_PORT_INFO = 0x0001
    NOTICE = 0x0002
    IO_UNIT_INFO = 0x0010
    IO_CONTROLLER_PROFILE = 0x0011
    SERVICE_ENTRIES = 0x0012
    DIAGNOSTIC_TIMEOUT = 0x0020
    PREPARE_TO_TEST = 0x0021
    TEST_DEVICE_ONCE = 0x0022
    TEST_DEVICE_LOOP = 0x0023
    DIAG_CODE = 0x0024


class PerfAttr(enum.IntEnum):
    """Performance management attributes (class 0x04)."""

    CLASS_PORT_INFO = 0x0001
    PORT_SAMPLES_CONTROL = 0x0010
    PORT_SAMPLES_RESULT = 0x0011
    PORT_COUNTERS = 0x0012
    PORT_RCV_ERROR_DETAILS = 0x0015
    PORT_XMIT_DISCARD_DETAILS = 0x0016
    PORT_OP_RCV_COUNTERS = 0x0017
    PORT_FLOW_CTL_COUNTERS = 0x0018
    PORT_VL_OP_PACKETS = 0x0019
    PORT_VL_OP_DATA = 0x001A
    PORT_VL_XMIT_FLOW_CTL_UPDATE_ERRORS = 0x001B
    PORT_VL_XMIT_WAIT_COUNTERS = 0x001C
    PORT_COUNTERS_EXT = 0x001D
    PORT_SAMPLES_RESULT_EXT = 0x001E
    PORT_XMIT_DATA_SL = 0x0036
    PORT_RCV_DATA_SL = 0x0037


# PerfMgt ClassPortInfo CapabilityMask bits perfquery looks at.
PM_ALL_PORT_SELECT: Final = 0x0100
PM_EXT_WIDTH_SUPPORTED: Final = 0x0200
PM_EXT_WIDTH_NOIETF_SUP: Final = 0x0400
PM_PC_XMIT_WAIT_SUP: Final = 0x1000
