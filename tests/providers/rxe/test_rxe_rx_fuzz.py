"""A bounded random run over rxe's receive path (issue 25 §3).

Datagrams of every shape (random bytes, and well-formed packets of every opcode
with random fields, some bytes then flipped) go through the frame split, the
decoder with its ICRC check, and into RC, UC and UD transport cores in RTS.
Allowed outcomes: ``None`` from the split, ``Malformed`` from the decoder, or a
packet the core takes (executes, NAKs, drops and counts).  Anything else fails.
The seed is fixed so a failure reproduces; figures in docs/testing.md.
"""

from __future__ import annotations

import collections
import random

from rxeharness import connect

from ibal.providers.rxe import wire
from ibal.types import QpType
from ibal.wire import iba
from ibal.wire import packet as pk
from ibal.wire.packet import Opcode, Packet

CASES = 3000
SRC4, DST4 = b"\x0a\0\0\x01", b"\x0a\0\0\x02"


def _random_packet(rng: random.Random, dest_qpn: int) -> Packet:
    op = rng.choice(list(Opcode))
    payload = rng.randbytes(rng.randrange(0, 300)) if pk.OP_FLAGS[op] & pk.PAYLOAD else b""
    p = Packet(op, payload=payload)
    for t in iba.FORMATS[op].headers:  # type: ignore[union-attr]
        for f in t.values:
            if f.name in ("pad", "tver", "opcode"):
                continue
            bits = f.field.bits
            # edges as often as the middle: 0, the top, one either side of a PSN window
            v = rng.choice([0, 1, (1 << bits) - 1, rng.getrandbits(bits)])
            setattr(p, f.name, bool(v & 1) if bits == 1 else v)
    p.dest_qpn = dest_qpn if rng.random() < 0.9 else rng.getrandbits(24)
    return p


def test_random_datagrams_only_drop_or_land() -> None:
    rng = random.Random(25)
    nodes = {t: connect(t)[1] for t in (QpType.RC, QpType.UC, QpType.UD)}
    outcomes: collections.Counter[str] = collections.Counter()
    for i in range(CASES):
        qp_type = (QpType.RC, QpType.UC, QpType.UD)[i % 3]
        node = nodes[qp_type]
        if i % 10 == 0:
            data = rng.randbytes(rng.randrange(0, 120))
        else:
            p = _random_packet(rng, node.cfg.qpn)
            raw = bytearray(wire.encode_bytes(p, wire.icrc_prefix(
                wire.ip_udp_headers(SRC4, DST4, 0xC000, 0))))  # fmt: skip
            for _ in range(rng.choice([0, 0, 1, 3])):  # some flipped after the ICRC
                if raw:
                    raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            data = wire.ip_udp_headers(SRC4, DST4, 0xC000, len(raw)) + bytes(raw)
        frame = wire.split_ip(data)
        if frame is None:
            outcomes["not a frame"] += 1
            continue
        try:
            q = wire.decode_frame(frame, check=rng.random() < 0.5)
        except iba.Malformed as e:
            outcomes[f"malformed: {e.reason.value}"] += 1
            continue
        q.dest_qpn = node.cfg.qpn
        node.core.receive(q, float(i))
        node.core.poll(float(i))
        node.core.handle_timer(float(i) + 100.0)
        outcomes[f"taken by {qp_type.name} ({node.cfg.state.name})"] += 1
    assert sum(outcomes.values()) == CASES
    # something reached every layer: the run is not all rejected at the split
    assert any(k.startswith("malformed") for k in outcomes)
    assert any(k.startswith("taken by RC") for k in outcomes)
    print(f"\nrxe rx fuzz: {CASES} datagrams; {dict(outcomes)}")
