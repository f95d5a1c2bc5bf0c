"""tshark as an independent checker of captures (tests and ``ibal`` tooling).

Wireshark decodes RoCEv2 on UDP 4791 ("RRoCE") and raw InfiniBand
(as DLT_USER0 with a preference, :data:`~ibal.wire.pcap.WIRESHARK_IB_PREF`)
but does not check the ICRC; it does flag
malformed headers and wrong lengths.  RPC-over-RDMA's heuristic dissector
claims short SEND payloads and then calls them malformed, so it is disabled
(``roce-wire.md`` section 4).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from ibal.wire.pcap import WIRESHARK_IB_PREF

FIELDS = (
    "frame.number",
    "frame.protocols",
    "infiniband.bth.opcode",
    "infiniband.bth.psn",
    "infiniband.bth.destqp",
    "ip.checksum.status",
    "_ws.malformed",
    "_ws.expert.message",
)


@dataclass(frozen=True)
class TsharkPacket:
    """What tshark made of one frame."""

    number: int
    protocols: tuple[str, ...]
    opcode: int | None
    psn: int | None
    dest_qp: int | None
    ip_checksum_status: str
    malformed: bool
    expert: str

    @property
    def clean(self) -> bool:
        """Decoded as InfiniBand, no malformed mark, no expert info, no bad IP checksum."""
        return (
            "infiniband" in self.protocols
            and not self.malformed
            and not self.expert
            and self.ip_checksum_status in ("", "1", "2")  # good / unverified / no IP
        )


def tshark_path() -> str | None:
    return shutil.which("tshark")


def tshark_decode(path: str | os.PathLike[str], *, timeout: float = 120.0) -> list[TsharkPacket]:
    """Run tshark over a capture file; one record per frame.  Raises if tshark fails."""
    exe = tshark_path()
    if exe is None:
        raise FileNotFoundError("tshark not found (Debian package tshark)")
    argv = [
        exe, "-n", "-r", os.fspath(path), "--disable-protocol", "rpcordma",
        "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
        "-o", WIRESHARK_IB_PREF,
        "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=|",
    ]  # fmt: skip
    for f in FIELDS:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"tshark failed ({r.returncode}): {r.stderr.strip()}")
    out = []
    for line in r.stdout.splitlines():
        cols = line.split("\t") + [""] * len(FIELDS)
        num, protos, op, psn, dqp, ipck, malformed, expert = cols[: len(FIELDS)]
        out.append(
            TsharkPacket(
                int(num),
                tuple(protos.split(":")),
                _int(op),
                _int(psn),
                _int(dqp),
                ipck,
                bool(malformed),
                expert,
            )
        )
    return out


def _int(text: str) -> int | None:
    if not text:
        return None
    return int(text.split("|")[0], 0)
