"""pcap files: a writer for ``IBAL_CAPTURE`` and a small reader for tests.

Classic libpcap format (microsecond timestamps, host byte order, as tcpdump
writes it).  One file holds one link type: RoCEv2 providers write Ethernet
frames (``LINKTYPE_ETHERNET``), the mock fabric InfiniBand packets starting at
the LRH (``LINKTYPE_INFINIBAND``, see there why it is DLT_USER0).
:func:`capture_for` hands every user in the process the same writer per file
and link type, so two devices capturing to one file interleave their packets
in time order.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

LINKTYPE_ETHERNET: Final = 1
LINKTYPE_INFINIBAND_REGISTERED: Final = 247
"""tcpdump.org's LINKTYPE_INFINIBAND; Wireshark 4.0 cannot open such files."""
LINKTYPE_USER0: Final = 147
LINKTYPE_INFINIBAND: Final = LINKTYPE_USER0
"""What IB captures use: DLT_USER0, which Wireshark maps to its InfiniBand
dissector with the preference in :data:`WIRESHARK_IB_PREF`."""
WIRESHARK_IB_PREF: Final = 'uat:user_dlts:"User 0 (DLT=147)","infiniband","0","","0",""'

_MAGIC: Final = 0xA1B2C3D4
_MAGIC_NS: Final = 0xA1B23C4D
_FILE_HDR: Final = struct.Struct("=IHHiIII")
_REC_HDR: Final = struct.Struct("=IIII")
SNAPLEN: Final = 262144

CAPTURE_ENV: Final = "IBAL_CAPTURE"


class PcapWriter:
    """Appends packets to a pcap file; safe to call from several threads."""

    def __init__(self, path: str | os.PathLike[str], linktype: int, *, flush: bool = True) -> None:
        self.path = Path(path)
        self.linktype = linktype
        self._flush = flush
        self._lock = threading.Lock()
        self._f: BinaryIO | None = open(self.path, "wb")  # noqa: SIM115 - lives until close()
        self._f.write(_FILE_HDR.pack(_MAGIC, 2, 4, 0, 0, SNAPLEN, linktype))
        self.count = 0

    def write(self, frame: bytes | bytearray | memoryview, ts: float | None = None) -> None:
        """One packet; ``ts`` in seconds since the epoch (default: now)."""
        if ts is None:
            ts = time.time()
        sec = int(ts)
        usec = min(int((ts - sec) * 1e6), 999_999)
        data = bytes(frame[:SNAPLEN])
        rec = _REC_HDR.pack(sec, usec, len(data), len(frame))
        with self._lock:
            if self._f is None:
                return
            self._f.write(rec + data)
            self.count += 1
            if self._flush:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None

    @property
    def closed(self) -> bool:
        return self._f is None

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Record:
    """One packet read back from a pcap file."""

    ts: float
    data: bytes
    orig_len: int


def read_pcap(path: str | os.PathLike[str]) -> tuple[int, list[Record]]:
    """(link type, records) of a classic pcap file, either byte order."""
    raw = Path(path).read_bytes()
    return parse_pcap(raw)


def parse_pcap(raw: bytes) -> tuple[int, list[Record]]:
    if len(raw) < _FILE_HDR.size:
        raise ValueError("not a pcap file: too short")
    for order in ("<", ">"):
        magic = struct.unpack_from(order + "I", raw)[0]
        if magic in (_MAGIC, _MAGIC_NS):
            break
    else:
        raise ValueError("not a pcap file: bad magic")
    scale = 1e-9 if magic == _MAGIC_NS else 1e-6
    linktype = struct.unpack_from(order + "I", raw, 20)[0] & 0xFFFF
    rec = struct.Struct(order + "IIII")
    out: list[Record] = []
    for sec, frac, _incl, orig, data in _records(raw, rec):
        out.append(Record(sec + frac * scale, data, orig))
    return linktype, out


def _records(raw: bytes, rec: struct.Struct) -> Iterator[tuple[int, int, int, int, bytes]]:
    off = _FILE_HDR.size
    while off + rec.size <= len(raw):
        sec, frac, incl, orig = rec.unpack_from(raw, off)
        off += rec.size
        if off + incl > len(raw):
            raise ValueError("truncated pcap record")
        yield sec, frac, incl, orig, raw[off : off + incl]
        off += incl


# ------------------------------------------------------------- process-wide captures

_writers: dict[tuple[Path, int], PcapWriter] = {}
_writers_lock = threading.Lock()


def capture_path(linktype: int, base: str | os.PathLike[str]) -> Path:
    """The file for ``linktype`` given the configured name: the name itself for
    Ethernet, ``NAME-ib.pcap``-style for InfiniBand (a pcap holds one link type)."""
    p = Path(base)
    if linktype == LINKTYPE_ETHERNET:
        return p
    return p.with_name(f"{p.stem}-ib{p.suffix or '.pcap'}")


def capture_for(
    linktype: int, option: str | os.PathLike[str] | None = None
) -> PcapWriter | None:
    """The shared writer for this process's capture file, or ``None``.

    ``option`` (a per-device setting) wins over the ``IBAL_CAPTURE`` variable;
    neither set means no capture.  A writer stays open until :func:`close_captures`.
    """
    base = option if option is not None else os.environ.get(CAPTURE_ENV)
    if not base:
        return None
    path = capture_path(linktype, base).resolve()
    with _writers_lock:
        w = _writers.get((path, linktype))
        if w is None or w.closed:
            w = _writers[(path, linktype)] = PcapWriter(path, linktype)
        return w


def close_captures() -> None:
    """Close every shared writer (tests; at exit the OS closes them anyway)."""
    with _writers_lock:
        for w in _writers.values():
            w.close()
        _writers.clear()
