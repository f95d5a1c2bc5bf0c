"""MADs as RoCEv2 frames on QP1 (what Linux sends for CM on RoCE), and tshark's view of them."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from ibal.providers.rxe.wire import capture_frame, encode_bytes, icrc_prefix_ipv4, ip_bytes
from ibal.wire.packet import Packet
from ibal.wire.pcap import LINKTYPE_ETHERNET, PcapWriter
from ibal.wire.tshark import tshark_path

SRC, DST = ip_bytes("10.1.16.61"), ip_bytes("10.1.16.62")
SPORT = 0xD872
GSI_QKEY = 0x80010000


def mad_frame(mad: bytes) -> bytes:
    """A UD SEND_ONLY to QP1 carrying ``mad``, with a correct ICRC."""
    p = Packet(0x64, 1, 0, mad, pkey=0xFFFF)
    p.qkey, p.src_qpn = GSI_QKEY, 1
    n = 12 + 8 + len(mad) + 4
    payload = encode_bytes(p, icrc_prefix_ipv4(SRC, DST, n, SPORT))
    assert len(payload) == n
    return capture_frame(payload, SRC, DST, SPORT)


def tshark_fields(mads: Sequence[bytes], tmp: Path) -> list[dict[str, list[tuple[str, str]]]]:
    """tshark's PDML per frame: field name -> [(show, value)] (a name may repeat)."""
    path = tmp / "mads.pcap"
    with PcapWriter(path, LINKTYPE_ETHERNET) as w:
        for i, m in enumerate(mads):
            w.write(mad_frame(m), ts=1.0 + i)
    exe = tshark_path()
    assert exe is not None
    r = subprocess.run(
        [exe, "-n", "-r", os.fspath(path), "--disable-protocol", "rpcordma", "-T", "pdml"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    out = []
    for pkt in ET.fromstring(r.stdout).iter("packet"):
        d: dict[str, list[tuple[str, str]]] = {}
        for f in pkt.iter("field"):
            d.setdefault(f.get("name", ""), []).append((f.get("show", ""), f.get("value", "")))
        out.append(d)
    return out
