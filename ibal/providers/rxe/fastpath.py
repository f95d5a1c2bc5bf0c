"""The rxe engine's byte work: the compiled module (``fastpath.c``) or its pure-Python twin.

``fastpath.c`` is built by ``pip install`` through cffi (API mode, out of line,
module ``ibal.providers.rxe._fastpath``) where gcc and the Python headers
exist; elsewhere ibal runs as pure Python.  ``IBAL_RXE_ENGINE`` chooses:
``auto`` (the default: C when built, else Python with one warning), ``c``
(C or an error), ``python``.  Every function here is the twin of the C
function of the same name (``rxe_`` prefixed there), so tests run both and
compare their bytes.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import struct
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final, Literal

from ibal.status import InvalidSetting, Unsupported

ENV_ENGINE: Final = "IBAL_RXE_ENGINE"
ENV_FAST_RX: Final = "IBAL_RXE_FAST_RX"
"""``0`` turns the C engine's receive fast path off (the C byte work stays)."""
ENV_FAST_TX: Final = "IBAL_RXE_FAST_TX"
"""``0`` turns the C engine's send side off (SEND/WRITE WQEs cut by ``rxe_fill_wqe``)."""
ENV_MODULE: Final = "IBAL_RXE_C_MODULE"
"""A path to another build of the compiled module (CI's sanitizer build) to load instead."""
ENGINES: Final = ("auto", "c", "python")
Engine = Literal["c", "python"]
MODULE: Final = "ibal.providers.rxe._fastpath"
BTH_LEN: Final = 12
ICRC_LEN: Final = 4
MAX_TRAIN: Final = 64
_LRH_ONES: Final = b"\xff" * 8
_IPV4_MASKED: Final = struct.Struct(">BBHHHBBH4s4sHHHH")

_loaded: list[ModuleType | None] = []
_warned: list[bool] = []


class EngineUnavailable(Unsupported):
    """``IBAL_RXE_ENGINE=c`` where the compiled engine was not built."""


def compiled() -> ModuleType | None:
    """The compiled module (``.ffi``, ``.lib``), or None where it was not built."""
    if not _loaded:
        mod: ModuleType | None = None
        try:
            path = os.environ.get(ENV_MODULE)
            if path:
                spec = importlib.util.spec_from_file_location(MODULE, path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"{ENV_MODULE}={path!r} is not a module")
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            else:
                mod = importlib.import_module(MODULE)
        except ImportError:
            if os.environ.get(ENV_MODULE):
                raise
            mod = None
        if mod is not None and not _current(mod):
            if os.environ.get(ENV_MODULE):
                raise ImportError(f"{ENV_MODULE}: {mod.__file__} was built from other sources")
            warnings.warn(
                f"ibal: the compiled rxe engine ({mod.__file__}) was built from older sources "
                "and is not used; rebuild it with pip install -e .",
                RuntimeWarning,
                stacklevel=2,
            )
            mod = None
        if mod is not None:
            mod.lib.rxe_init()
        _loaded.append(mod)
    return _loaded[0]


def _current(mod: ModuleType) -> bool:
    """Whether ``mod`` was built from the sources beside it (not left over from before)."""
    from ibal.providers.rxe._fastpath_build import source_digest

    digest = getattr(mod.lib, "rxe_source_digest", None)
    return digest is not None and mod.ffi.string(digest()).decode() == source_digest()


def choose(env: str | None = None) -> Engine:
    """The engine ``IBAL_RXE_ENGINE`` (or ``env``) asks for and this install has."""
    want = (os.environ.get(ENV_ENGINE, "auto") if env is None else env).strip().lower() or "auto"
    if want not in ENGINES:
        raise InvalidSetting(f"{ENV_ENGINE}={want!r}: expected one of {', '.join(ENGINES)}")
    if want == "python":
        return "python"
    if compiled() is not None:
        return "c"
    if want == "c":
        raise EngineUnavailable(
            f"{ENV_ENGINE}=c but the compiled rxe engine ({MODULE}) is not built: "
            "reinstall ibal where gcc and the Python headers exist"
        )
    if not _warned:
        _warned.append(True)
        warnings.warn(
            f"ibal: the compiled rxe engine is not built; rxe runs as pure Python "
            f"(set {ENV_ENGINE}=python to say so)",
            RuntimeWarning,
            stacklevel=2,
        )
    return "python"


def fast_rx_enabled() -> bool:
    """Whether a C-engine device takes its receive batches through ``rxe_rx_fast``."""
    return os.environ.get(ENV_FAST_RX, "1").strip() != "0"


def fast_tx_enabled() -> bool:
    """Whether a C-engine device cuts whole SEND/WRITE WQEs in ``rxe_fill_wqe``."""
    return os.environ.get(ENV_FAST_TX, "1").strip() != "0"


# ----------------------------------------------------------------- the Python twins


def crc32(crc: int, data: bytes | bytearray | memoryview) -> int:
    """Twin of ``rxe_crc32``."""
    return zlib.crc32(data, crc)


def icrc_prefix_ipv4(
    src: bytes, dst: bytes, udp_payload_len: int, sport: int, ident: int, frag: int, dport: int
) -> int:
    """Twin of ``rxe_icrc_prefix_ipv4`` (and of ``wire.icrc_prefix_ipv4``)."""
    udp_len = 8 + udp_payload_len
    hdr = _IPV4_MASKED.pack(
        0x45, 0xFF, 20 + udp_len, ident, frag, 0xFF, 17, 0xFFFF, src, dst,
        sport, dport, udp_len, 0xFFFF,
    )  # fmt: skip
    return zlib.crc32(hdr, zlib.crc32(_LRH_ONES))


def icrc(udp_payload: bytes | bytearray | memoryview, prefix: int) -> int:
    """Twin of ``rxe_icrc``: over BTH (byte 4 masked) .. the byte before the ICRC."""
    mv = memoryview(udp_payload)
    bth = bytearray(mv[:BTH_LEN])
    bth[4] = 0xFF
    return zlib.crc32(mv[BTH_LEN:-ICRC_LEN], zlib.crc32(bth, prefix))


def train_bytes(
    src: bytes, dst: bytes, sport: int, dport: int, bth: bytes, psn: int,
    payload: bytes | bytearray | memoryview, mtu: int, n: int, id0: int,
) -> list[bytes]:  # fmt: skip
    """Twin of ``rxe_send_train``'s datagrams: the n UDP payloads it sends."""
    seg = BTH_LEN + mtu + ICRC_LEN
    out = []
    for k in range(n):
        h = bytearray(bth)
        h[9:12] = ((psn + k) & 0xFFFFFF).to_bytes(3, "big")
        body = bytes(payload[k * mtu : (k + 1) * mtu])
        pre = icrc_prefix_ipv4(src, dst, seg, sport, (id0 + k) & 0xFFFF, 0x4000, dport)
        m = bytearray(h)
        m[4] = 0xFF
        c = zlib.crc32(body, zlib.crc32(m, pre))
        out.append(bytes(h) + body + c.to_bytes(4, "little"))
    return out


def send_train(
    sock: socket.socket, src: bytes, dst: bytes, dport: int, bth: bytes, psn: int,
    payload: bytes | bytearray | memoryview, mtu: int, n: int, id0: int = 0,
) -> int:  # fmt: skip
    """Twin of ``rxe_send_train``: one ``sendmsg`` with ``UDP_SEGMENT``."""
    sport = sock.getsockname()[1]
    parts = train_bytes(src, dst, sport, dport, bth, psn, payload, mtu, n, id0)
    seg = len(parts[0])
    anc = [(17, 103, struct.pack("=H", seg))] if n > 1 else []
    return sock.sendmsg(parts, anc, 0, (socket.inet_ntoa(dst), dport))


@dataclass
class BenchStats:
    """Twin of ``struct rxe_bench_stats``."""

    calls: int = 0
    datagrams: int = 0
    packets: int = 0
    bytes: int = 0
    bad_icrc: int = 0
    short_: int = 0


def land_segment(
    seg: memoryview, src: bytes, dst: bytes, sport: int, ident: int,
    mem: bytearray, mtu: int, st: BenchStats,
) -> None:  # fmt: skip
    """Twin of ``land_segment``: ICRC check, then the payload to (PSN mod slots) * mtu."""
    n = len(seg)
    if n < BTH_LEN + ICRC_LEN:
        st.short_ += 1
        return
    pre = icrc_prefix_ipv4(src, dst, n, sport, ident, 0x4000, 4791)
    if icrc(seg, pre) != int.from_bytes(seg[-ICRC_LEN:], "little"):
        st.bad_icrc += 1
        return
    pad = (seg[1] >> 4) & 3
    body = n - BTH_LEN - ICRC_LEN
    if mtu == 0 or pad > body or body - pad > mtu or len(mem) < mtu:
        st.short_ += 1
        return
    body -= pad
    off = (int.from_bytes(seg[9:12], "big") % (len(mem) // mtu)) * mtu
    mem[off : off + body] = seg[BTH_LEN : BTH_LEN + body]
    st.packets += 1
    st.bytes += body


def land_datagram(
    data: bytes | bytearray | memoryview, raw: bool, seg: int, peer: tuple[bytes, int] | None,
    local_ip: bytes, gro: int, mem: bytearray, mtu: int, st: BenchStats,
) -> None:  # fmt: skip
    """Twin of ``rxe_recv_bench``'s work on one received datagram."""
    d = memoryview(data).cast("B")
    n = len(d)
    st.datagrams += 1
    if raw:
        if (
            n < 28 or d[0] != 0x45 or d[9] != 17
            or int.from_bytes(d[2:4], "big") != n
            or int.from_bytes(d[6:8], "big") & 0x3FFF
            or int.from_bytes(d[24:26], "big") != n - 20
            or int.from_bytes(d[22:24], "big") != 4791
        ):  # fmt: skip
            st.short_ += 1
            return
        src, dst = bytes(d[12:16]), bytes(d[16:20])
        sport = int.from_bytes(d[20:22], "big")
        ident = int.from_bytes(d[4:6], "big")
        d = d[28:]
        n -= 28
        step = seg or n
    else:
        assert peer is not None
        src, sport = peer
        dst, ident = local_ip, 0
        step = gro or n
    if n == 0:
        st.short_ += 1
        return
    for s, off in enumerate(range(0, n, step)):
        land_segment(d[off : off + step], src, dst, sport, (ident + s) & 0xFFFF, mem, mtu, st)


Crc32 = Callable[[Any, int], int]
"""``zlib.crc32``'s signature: (data, register) -> register."""
C_CRC_MIN: Final = 256
"""Below this many bytes ``zlib.crc32`` wins: the call into C costs more than the CRC."""


def payload_crc32(engine: Engine) -> Crc32:
    """The CRC-32 the socket layer runs over payloads: ``rxe_crc32`` for the C engine
    (carry-less multiplication, 3-4x zlib's on 4 KiB), ``zlib.crc32`` otherwise."""
    if engine == "python":
        return zlib.crc32
    ffi, lib = ffi_lib()
    fb = ffi.from_buffer
    c32 = lib.rxe_crc32
    z32 = zlib.crc32

    def crc32(data: Any, value: int = 0) -> int:
        n = len(data)
        if n < C_CRC_MIN:
            return z32(data, value)
        return int(c32(value, fb("uint8_t[]", data), n))

    return crc32


def ffi_lib() -> tuple[Any, Any]:
    """``(ffi, lib)`` of the compiled module; :class:`EngineUnavailable` without it."""
    mod = compiled()
    if mod is None:
        raise EngineUnavailable(f"the compiled rxe engine ({MODULE}) is not built")
    return mod.ffi, mod.lib


__all__ = [
    "ENGINES",
    "ENV_ENGINE",
    "BenchStats",
    "Engine",
    "EngineUnavailable",
    "choose",
    "compiled",
    "crc32",
    "fast_rx_enabled",
    "fast_tx_enabled",
    "ffi_lib",
    "icrc",
    "icrc_prefix_ipv4",
    "land_datagram",
    "land_segment",
    "payload_crc32",
    "send_train",
    "train_bytes",
]
