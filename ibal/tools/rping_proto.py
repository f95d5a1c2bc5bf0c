"""rping's protocol (librdmacm ``examples/rping.c``) as two sans-IO machines.

After the RDMA CM connection is established, each ping goes:

1. the client fills its *source* buffer with the ping text and SENDs a 16-byte
   ``rping_rdma_info`` (be64 address, be32 rkey, be32 size) naming it;
2. the server RDMA READs that many bytes into its buffer, then SENDs a
   "go ahead" (16 bytes; rping sends its never-formatted info buffer: zeros);
3. the client SENDs the info of its *sink* buffer;
4. the server RDMA WRITEs its buffer's text (up to and with the NUL) there and
   SENDs "go ahead" again;
5. the client (``-V``) compares sink and source.

The client disconnects after ``count`` pings; the server serves until the
connection goes.  A receive that is not 16 bytes ends either side ("Received
bogus data").  Each receive completion reposts the one receive, as rping does.
The machines see completions as events and answer with actions; the I/O
(verbs, buffers, the CM) is :mod:`ibal.tools.rping`'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from ibal.wire.fields import F, Table

__all__ = [
    "INFO", "INFO_SIZE", "MAX_SIZE", "MIN_SIZE", "Action", "Check", "Disconnect",
    "Disconnected", "Event", "Fill", "Finish", "GoAhead", "PostRead", "PostRecv", "PostWrite",
    "Print", "ReadDone", "Recv", "Region", "RpingClient", "RpingServer", "SendInfo",
    "WriteDone", "ping_text",
]  # fmt: skip

#: ``struct rping_rdma_info``.
INFO: Final = Table("rping_rdma_info", [
    F("buf", 64, hex=True),
    F("rkey", 32, hex=True),
    F("size", 32),
])  # fmt: skip
INFO_SIZE: Final = 16
#: ``RPING_MIN_BUFSIZE``: sizeof "2147483647" + sizeof "rdma-ping-%d: " (NULs included).
MIN_SIZE: Final = 11 + 15
#: ``RPING_BUFSIZE - 1``.
MAX_SIZE: Final = 64 * 1024 - 1
DEFAULT_SIZE: Final = 64
DEFAULT_PORT: Final = 7174


def ping_text(ping: int, size: int) -> bytes:
    """The client's source buffer for ping number ``ping`` (``rping_test_client``).

    ``"rdma-ping-N: "`` then letters from ``'A' + N % 58`` upwards, wrapping from
    ``'z'`` to ``'A'``, and a NUL in the last byte.
    """
    head = f"rdma-ping-{ping}: ".encode()[: size - 1]
    c = 65 + ping % 58
    body = bytearray()
    for _ in range(size - len(head)):
        body.append(c)
        c = 65 if c >= 122 else c + 1
    buf = bytearray(head + body)
    buf[size - 1] = 0
    return bytes(buf)


@dataclass(frozen=True, slots=True)
class Region:
    """A registered buffer the peer may access: what an info message names."""

    addr: int
    rkey: int
    size: int

    def info(self) -> bytes:
        return INFO.encode(buf=self.addr, rkey=self.rkey, size=self.size)

    @classmethod
    def from_info(cls, data: bytes) -> Region:
        v = INFO.decode(data)
        return cls(int(v["buf"]), int(v["rkey"]), int(v["size"]))


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Recv:
    """A receive completed with these bytes."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ReadDone:
    """The server's RDMA READ completed; ``text_len``: bytes before the first NUL."""

    text_len: int


@dataclass(frozen=True, slots=True)
class WriteDone:
    """The server's RDMA WRITE completed."""


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection went (DREQ received, or receives flushed)."""


Event = Recv | ReadDone | WriteDone | Disconnected


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class PostRecv:
    """Post the one 16-byte receive again."""


@dataclass(frozen=True, slots=True)
class Fill:
    """Client: write :func:`ping_text` of ``ping`` into the source buffer."""

    ping: int


@dataclass(frozen=True, slots=True)
class SendInfo:
    """SEND these 16 bytes (an info message)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class GoAhead:
    """Server: SEND the 16-byte "go ahead"."""


@dataclass(frozen=True, slots=True)
class PostRead:
    """Server: RDMA READ ``length`` bytes of the peer's region into the buffer."""

    region: Region
    length: int


@dataclass(frozen=True, slots=True)
class PostWrite:
    """Server: RDMA WRITE the buffer's first ``length`` bytes to the peer's region."""

    region: Region
    length: int


@dataclass(frozen=True, slots=True)
class Print:
    """Verbose output: the buffer's text (client: ``ping data``, server: ``server ping data``)."""

    prefix: str


@dataclass(frozen=True, slots=True)
class Check:
    """Client ``-V``: the sink must equal the source; a mismatch ends the run."""

    ping: int


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Client: all pings done, disconnect."""


@dataclass(frozen=True, slots=True)
class Finish:
    """The run is over: ``error`` is empty on success, else rping's message."""

    error: str = ""


Action = PostRecv | Fill | SendInfo | GoAhead | PostRead | PostWrite | Print | Check | \
    Disconnect | Finish  # fmt: skip


class ClientState(enum.Enum):
    IDLE = "idle"
    READ_ADV = "source advertised"
    WRITE_ADV = "sink advertised"
    DONE = "done"


class ServerState(enum.Enum):
    WAIT_SOURCE = "waiting for the source"
    READING = "reading"
    WAIT_SINK = "waiting for the sink"
    WRITING = "writing"
    DONE = "done"


def _bogus(data: bytes) -> Finish | None:
    if len(data) != INFO_SIZE:
        return Finish(f"Received bogus data, size {len(data)}")
    return None


class RpingClient:
    """The client's side: ``count`` pings (0: until stopped) from ``source`` into ``sink``."""

    def __init__(self, source: Region, sink: Region, *, count: int, verbose: bool,
                 validate: bool) -> None:  # fmt: skip
        self.source, self.sink = source, sink
        self.count, self.verbose, self.validate = count, verbose, validate
        self.state = ClientState.IDLE
        self.ping = 0

    def start(self) -> list[Action]:
        """Once established (the receive is already posted): the first ping."""
        if self.state is not ClientState.IDLE:
            raise RuntimeError("rping client already started")
        return self._ping()

    def _ping(self) -> list[Action]:
        self.state = ClientState.READ_ADV
        return [Fill(self.ping), SendInfo(self.source.info())]

    def handle(self, event: Event) -> list[Action]:
        if self.state is ClientState.DONE:
            return []
        if isinstance(event, Disconnected):
            self.state = ClientState.DONE
            return [Finish(f"disconnected during ping {self.ping} ({self.state.value})")]
        if not isinstance(event, Recv):
            self.state = ClientState.DONE
            return [Finish(f"unexpected {type(event).__name__} on the client")]
        bad = _bogus(event.data)
        if bad is not None:
            self.state = ClientState.DONE
            return [bad]
        if self.state is ClientState.READ_ADV:
            self.state = ClientState.WRITE_ADV
            return [PostRecv(), SendInfo(self.sink.info())]
        if self.state is ClientState.WRITE_ADV:
            out: list[Action] = [PostRecv()]
            if self.validate:
                out.append(Check(self.ping))
            if self.verbose:
                out.append(Print("ping data: "))
            self.ping += 1
            if self.count and self.ping >= self.count:
                self.state = ClientState.DONE
                return [*out, Disconnect(), Finish()]
            return [*out, *self._ping()]
        self.state = ClientState.DONE
        return [Finish("go ahead before the first ping")]


class RpingServer:
    """The server's side of one connection; its buffer holds ``size`` bytes."""

    def __init__(self, size: int, *, verbose: bool) -> None:
        self.size, self.verbose = size, verbose
        self.state = ServerState.WAIT_SOURCE
        self.pings = 0
        self._peer: Region | None = None
        self._text_len = 0

    def handle(self, event: Event) -> list[Action]:
        st = self.state
        if st is ServerState.DONE:
            return []
        if isinstance(event, Disconnected):
            self.state = ServerState.DONE
            if st is ServerState.WAIT_SOURCE:
                return [Finish()]
            return [Finish(f"disconnected while {st.value}")]
        if isinstance(event, Recv):
            bad = _bogus(event.data)
            if bad is not None:
                self.state = ServerState.DONE
                return [bad]
            peer = Region.from_info(event.data)
            if st is ServerState.WAIT_SOURCE:
                if peer.size > self.size:
                    # rping's READ fails with a local protection error here
                    self.state = ServerState.DONE
                    return [Finish(f"the client's {peer.size} bytes exceed the server's "
                                   f"{self.size} (use the same -S on both)")]  # fmt: skip
                self.state = ServerState.READING
                return [PostRecv(), PostRead(peer, peer.size)]
            if st is ServerState.WAIT_SINK:
                self.state = ServerState.WRITING
                return [PostRecv(), PostWrite(peer, min(self._text_len + 1, peer.size))]
        elif isinstance(event, ReadDone) and st is ServerState.READING:
            self._text_len = event.text_len
            self.state = ServerState.WAIT_SINK
            out: list[Action] = [Print("server ping data: ")] if self.verbose else []
            return [*out, GoAhead()]
        elif isinstance(event, WriteDone) and st is ServerState.WRITING:
            self.pings += 1
            self.state = ServerState.WAIT_SOURCE
            return [GoAhead()]
        self.state = ServerState.DONE
        return [Finish(f"unexpected {type(event).__name__} while {st.value}")]
