"""MAD headers as field tables, and a few helpers to build and answer whole MADs.

Layouts (IBA vol. 1: 13.4.2 common header, 14.2.1 SMPs, 15.2.1 SA, 16.1.1
PerfMgt) as :class:`~ibal.wire.fields.Table` objects:

========================  =========  ==============================================
table                     bytes      what
========================  =========  ==============================================
:data:`MAD_HEADER`        0..23      common header (method byte includes the R bit)
:data:`DR_HEADER`         0..23      the same for directed-route SMPs (D bit, hops)
:data:`SMP`               0..255     LID-routed SMP: header, M_Key, 64-byte data
:data:`DR_SMP`            0..255     directed-route SMP: DrSLID/DrDLID and paths
:data:`SA_HEADER`         36..55     SM_Key, AttributeOffset, ComponentMask
:data:`PERF_HEADER`       24..63     PerfMgt (and DevMgt): 40 reserved bytes
:data:`CLASS_PORT_INFO`   data       ClassPortInfo, common to all GSI classes
========================  =========  ==============================================

Bytes 24..35 of an SA MAD are the RMPP header (:mod:`ibal.transport.rmpp`).

Helpers: :func:`build` a request, :func:`respond` to one, :func:`header`
reads the common header as a :class:`Header` with one ``unpack``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from ibal.wire.fields import Buffer, F, Field, FieldError, Kind, R, Table
from ibal.wire.mad.consts import (
    CLASS_VERSION,
    DR_DIRECTION,
    MAD_SIZE,
    MgmtClass,
    response_method,
)

__all__ = [
    "CLASS_PORT_INFO",
    "DR_HEADER",
    "DR_SMP",
    "MAD_HEADER",
    "PERF_HEADER",
    "SA_HEADER",
    "SMP",
    "Header",
    "build",
    "data_offset",
    "data_size",
    "embed",
    "header",
    "header_of",
    "payload",
    "respond",
]

SMP_DATA: Final = 64  # SMP data: bytes 64..127
SMP_DATA_SIZE: Final = 64
SA_HEADER_OFFSET: Final = 36
SA_DATA: Final = 56  # SA data: bytes 56..255
SA_DATA_SIZE: Final = 200
PERF_DATA: Final = 64  # PerfMgt data: bytes 64..255
DM_DATA: Final = 64  # DevMgt data: bytes 64..255 (40 reserved bytes before, IBA 16.3.1)
GSI_DATA: Final = 24  # other classes without a class header
DR_PATH_SIZE: Final = 64


def embed(table: Table, at_bits: int = 0, prefix: str = "") -> list[Field]:
    """``table``'s rows placed at bit ``at_bits`` of another table, names prefixed.

    How a record nests an attribute (NodeRecord holds NodeInfo): the outer
    table lists the inner one's rows, so one compiled codec covers both.
    """
    out: list[Field] = []
    for p in table.fields:
        f = p.field
        name = "" if f.reserved else prefix + f.name
        out.append(Field(name, f.bits, f.kind, f.enum, f.reserved, at_bits + p.offset,
                         f.title, f.hex, f.default))  # fmt: skip
    return out


_COMMON_WORD0 = [
    F("base_version", 8, default=1),
    F("mgmt_class", 8, hex=True),
    F("class_version", 8, default=1),
    F("method", 8, hex=True),  # R bit included: see consts.Method
]
_COMMON_TAIL = [
    F("tid", 64, hex=True),
    F("attr_id", 16, hex=True),
    R(16),
    F("attr_mod", 32, hex=True),
]

MAD_HEADER: Final = Table("MAD header", [
    *_COMMON_WORD0,
    F("status", 16, hex=True),
    F("class_specific", 16, hex=True),
    *_COMMON_TAIL,
])  # fmt: skip

DR_HEADER: Final = Table("DR SMP header", [
    *_COMMON_WORD0,
    F("d", 1),  # direction: 1 on the way back
    F("status", 15, hex=True),
    F("hop_pointer", 8),
    F("hop_count", 8),
    *_COMMON_TAIL,
])  # fmt: skip

SMP: Final = Table("SMP", [
    *embed(MAD_HEADER),
    F("m_key", 64, hex=True),
    R(256),
    F("data", 8 * SMP_DATA_SIZE, kind=Kind.BYTES),
    R(1024),
])  # fmt: skip

DR_SMP: Final = Table("DR SMP", [
    *embed(DR_HEADER),
    F("m_key", 64, hex=True),
    F("dr_slid", 16, default=0xFFFF),
    F("dr_dlid", 16, default=0xFFFF),
    R(224),
    F("data", 8 * SMP_DATA_SIZE, kind=Kind.BYTES),
    F("initial_path", 8 * DR_PATH_SIZE, kind=Kind.BYTES),
    F("return_path", 8 * DR_PATH_SIZE, kind=Kind.BYTES),
])  # fmt: skip

SA_HEADER: Final = Table("SA header", [
    F("sm_key", 64, hex=True),
    F("attr_offset", 16),  # record size in 8-byte words (GetTable responses)
    R(16),
    F("comp_mask", 64, hex=True),
])  # fmt: skip

PERF_HEADER: Final = Table("PerfMgt header", [R(320)])

CLASS_PORT_INFO: Final = Table("ClassPortInfo", [
    F("base_version", 8),
    F("class_version", 8),
    F("capability_mask", 16, hex=True),
    F("capability_mask2", 27, hex=True),
    F("resp_time_value", 5),
    F("redirect_gid", 128, kind=Kind.GID),
    F("redirect_tc", 8, hex=True),
    F("redirect_sl", 4),
    F("redirect_fl", 20, hex=True),
    F("redirect_lid", 16),
    F("redirect_p_key", 16, hex=True),
    R(8),
    F("redirect_qp", 24, hex=True),
    F("redirect_q_key", 32, hex=True),
    F("trap_gid", 128, kind=Kind.GID),
    F("trap_tc", 8, hex=True),
    F("trap_sl", 4),
    F("trap_fl", 20, hex=True),
    F("trap_lid", 16),
    F("trap_p_key", 16, hex=True),
    F("trap_hl", 8),
    F("trap_qp", 24, hex=True),
    F("trap_q_key", 32, hex=True),
])  # fmt: skip


class Header(NamedTuple):
    """The common MAD header, read with one ``unpack``."""

    base_version: int
    mgmt_class: int
    class_version: int
    method: int
    status: int
    class_specific: int
    tid: int
    attr_id: int
    attr_mod: int


_unpack_header = MAD_HEADER.unpack


def header(mad: Buffer) -> Header:
    """The common header of ``mad``; raises ``FieldError('short')`` under 24 bytes."""
    if len(mad) < MAD_HEADER.size:
        raise FieldError("short", f"MAD header: need 24 bytes, have {len(mad)}")
    return Header(*_unpack_header(mad, 0))


def header_of(mad: Buffer, mgmt_class: int, what: str) -> Header:
    """The header of a whole ``what`` MAD; ``FieldError`` when it is short or of another class."""
    if len(mad) < MAD_SIZE:
        raise FieldError("short", f"a {what} MAD is {MAD_SIZE} bytes, got {len(mad)}")
    h = Header(*_unpack_header(mad, 0))
    if h.mgmt_class != mgmt_class:
        raise FieldError("type", f"management class {h.mgmt_class:#04x} is not {what}")
    return h


def data_offset(mgmt_class: int) -> int:
    """Where a class's attribute data starts in a MAD."""
    if mgmt_class in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR):
        return SMP_DATA
    if mgmt_class == MgmtClass.SUBN_ADM:
        return SA_DATA
    if mgmt_class == MgmtClass.PERF:
        return PERF_DATA
    if mgmt_class == MgmtClass.DEV_MGT:
        return DM_DATA
    return GSI_DATA


def data_size(mgmt_class: int) -> int:
    """How many bytes of attribute data a class's MAD holds (SMPs: 64, before the DR paths)."""
    if mgmt_class in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR):
        return SMP_DATA_SIZE
    return MAD_SIZE - data_offset(mgmt_class)


def payload(mad: Buffer) -> memoryview:
    """The attribute data of ``mad`` (a view: no copy), for its class."""
    off = data_offset(mad[1])
    return memoryview(mad)[off : off + data_size(mad[1])]


def build(
    mgmt_class: int,
    method: int,
    attr_id: int,
    *,
    tid: int,
    attr_mod: int = 0,
    data: Buffer = b"",
    status: int = 0,
    class_version: int | None = None,
    m_key: int = 0,
    dr_path: Sequence[int] | None = None,
    dr_slid: int = 0xFFFF,
    dr_dlid: int = 0xFFFF,
    sm_key: int = 0,
    comp_mask: int = 0,
) -> bytearray:
    """A 256-byte MAD: the common header, the class header, ``data`` at the class's offset.

    ``dr_path`` (directed-route SMPs only) lists the out ports of the hops
    (``[]`` is the local port): it becomes the initial path (entry 0 unused)
    and the hop count.  ``sm_key``/``comp_mask`` go to the SA header.
    Fields are checked (``FieldError`` names the one that does not fit).
    """
    if class_version is None:
        class_version = CLASS_VERSION.get(mgmt_class, 1)
    off, room = data_offset(mgmt_class), data_size(mgmt_class)
    if len(data) > room:
        raise FieldError("range", f"MAD data: {len(data)} bytes do not fit {room}")
    mad = bytearray(MAD_SIZE)
    common = {"mgmt_class": mgmt_class, "class_version": class_version, "method": method,
              "tid": tid, "attr_id": attr_id, "attr_mod": attr_mod}  # fmt: skip
    if mgmt_class == MgmtClass.SUBN_DR:
        path = list(dr_path or [])
        if len(path) > 63:
            raise FieldError("range", "DR SMP: at most 63 hops", "hop_count")
        init = bytes([0, *path]).ljust(DR_PATH_SIZE, b"\0")
        DR_SMP.pack_into(mad, 0, *DR_SMP.check({
            **common, "status": status, "hop_count": len(path), "m_key": m_key,
            "dr_slid": dr_slid, "dr_dlid": dr_dlid, "data": bytes(SMP_DATA_SIZE),
            "initial_path": init, "return_path": bytes(DR_PATH_SIZE),
        }))  # fmt: skip
    else:
        MAD_HEADER.pack_into(mad, 0, *MAD_HEADER.check({**common, "status": status}))
        if mgmt_class == MgmtClass.SUBN_LID:
            if not 0 <= m_key < 1 << 64:
                raise FieldError("range", f"SMP.m_key={m_key} does not fit 64 bits", "m_key")
            mad[24:32] = m_key.to_bytes(8, "big")
        elif mgmt_class == MgmtClass.SUBN_ADM:
            SA_HEADER.pack_into(
                mad, SA_HEADER_OFFSET, *SA_HEADER.check({"sm_key": sm_key, "comp_mask": comp_mask})
            )
    mad[off : off + len(data)] = data
    return mad


def respond(request: Buffer, *, status: int = 0, data: Buffer | None = None) -> bytearray:
    """The response to ``request``: a copy with the response method and ``status``.

    A directed-route SMP response gets the D bit; the hop pointer and paths
    are the responder's business (IBA 14.2.2).  ``data``, if given, replaces
    the attribute data (zero-filled to the end of the class's data area; the
    DR paths stay).
    """
    if len(request) < MAD_SIZE:
        raise FieldError("short", f"MAD: need {MAD_SIZE} bytes, have {len(request)}")
    out = bytearray(request[:MAD_SIZE])
    out[3] = response_method(out[3])
    if status < 0 or status > 0x7FFF:
        raise FieldError("range", f"MAD status {status:#x} does not fit 15 bits", "status")
    if out[1] == MgmtClass.SUBN_DR:
        status |= DR_DIRECTION
    out[4:6] = status.to_bytes(2, "big")
    if data is not None:
        off, room = data_offset(out[1]), data_size(out[1])
        if len(data) > room:
            raise FieldError("range", f"MAD data: {len(data)} bytes do not fit {room}")
        out[off : off + room] = bytes(data).ljust(room, b"\0")
    return out
