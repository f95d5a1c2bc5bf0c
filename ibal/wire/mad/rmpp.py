"""The RMPP header (IBA vol.1 13.6.2) as a field table, its numbers and flags.

Bytes 24..35 of a MAD whose class uses RMPP; the sender and receiver machines
that read and write it are :mod:`ibal.transport.rmpp`.  Segment layout: bytes
0..23 the common MAD header, 24..35 the RMPP header, then 220 bytes per segment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ibal.wire.fields import Buffer, F, FieldError, Table
from ibal.wire.mad.consts import MAD_SIZE
from ibal.wire.mad.header import MAD_HEADER

COMMON_HEADER_SIZE = MAD_HEADER.size  # 24
RMPP_OFFSET = COMMON_HEADER_SIZE
RMPP_HEADER_SIZE = 12
RMPP_DATA = RMPP_OFFSET + RMPP_HEADER_SIZE  # 36: class header, then the segment's data
VENDOR_HEADER_SIZE = 4  # vendor range 2's class header: a reserved byte, the OUI
SEGMENT_AREA = MAD_SIZE - RMPP_DATA  # 220
RMPP_VERSION = 1
NO_RESP_TIME = 0x1F

METHOD_BYTE = MAD_HEADER.by_name["method"].offset // 8


class RmppType(enum.IntEnum):
    NONE = 0  # not an RMPP MAD (Active clear)
    DATA = 1
    ACK = 2
    STOP = 3
    ABORT = 4


class RmppFlags(enum.IntFlag):
    ACTIVE = 0x1
    FIRST = 0x2
    LAST = 0x4


class RmppStatus(enum.IntEnum):
    NORMAL = 0
    RESOURCES_EXHAUSTED = 1  # STOP
    TOTAL_TIME_TOO_LONG = 118
    INCONSISTENT_LAST_LENGTH = 119
    INCONSISTENT_FIRST_SEGMENT = 120
    BAD_TYPE = 121
    WINDOW_LAST_TOO_SMALL = 122
    SEGMENT_TOO_BIG = 123
    ILLEGAL_STATUS = 124
    UNSUPPORTED_VERSION = 125
    TOO_MANY_RETRIES = 126
    UNSPECIFIED = 127


ABORT_STATUSES = frozenset(s for s in RmppStatus if s >= 118)

RMPP_HEADER = Table(
    "RMPP header",
    [
        F("version", 8, title="RMPPVersion"),
        F("type", 8, enum=RmppType, title="RMPPType"),
        F("resp_time", 5, title="RRespTime"),
        F("flags", 3, enum=RmppFlags, title="RMPPFlags"),
        F("status", 8, title="RMPPStatus"),
        F("segment_number", 32, title="SegmentNumber"),
        F("payload_length", 32, title="PayloadLength/NewWindowLast"),
    ],
)
"""Bytes 24..35 of a MAD.  ``payload_length`` is NewWindowLast in an ACK; zero
in STOP and ABORT.  ``status`` is a plain integer so a forged value decodes."""
assert RMPP_HEADER.size == RMPP_HEADER_SIZE


@dataclass(frozen=True, slots=True)
class RmppHeader:
    version: int
    type: int
    resp_time: int
    flags: int
    status: int
    segment_number: int
    payload_length: int

    @classmethod
    def of(cls, mad: Buffer) -> RmppHeader:
        """The RMPP header of ``mad``; raises ``FieldError('short')`` below 36 bytes."""
        if len(mad) < RMPP_DATA:
            raise FieldError("short", f"an RMPP MAD has at least {RMPP_DATA} bytes, got {len(mad)}")
        return cls(*RMPP_HEADER.unpack(mad, RMPP_OFFSET))

    @property
    def active(self) -> bool:
        return bool(self.flags & RmppFlags.ACTIVE)


_ACTIVE = int(RmppFlags.ACTIVE)  # a plain int: IntFlag arithmetic costs per MAD


def is_rmpp(mad: Buffer) -> bool:
    """Whether ``mad`` has the RMPP Active flag (byte 26 bit 0)."""
    return len(mad) >= RMPP_DATA and bool(mad[26] & _ACTIVE)


def with_rmpp(mad: bytes | bytearray, **fields: int) -> bytes:
    """``mad`` with its RMPP header replaced (the other bytes kept)."""
    out = bytearray(mad)
    RMPP_HEADER.pack_into(out, RMPP_OFFSET, *RMPP_HEADER.check(fields))
    return bytes(out)
