"""Both tools' tests: a two-CA mock and a server/client pair over localhost TCP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ibal
from ibal.al import AccessLayer


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        yield al


def ca_names(al: AccessLayer) -> list[str]:
    names = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        names.append(ca.name)
        ca.close(wait=True)
    return names


@pytest.fixture
def pair(al: AccessLayer) -> Callable[..., tuple[Any, Any]]:
    """``pair(run, Options, **common)``: a tool's server and client on the mock's two CAs."""
    return lambda run, options, **kw: run_pair(al, run, options, **kw)


def run_pair(
    al: AccessLayer,
    run: Callable[..., Any],
    options: Callable[..., Any],
    *,
    server: dict[str, Any] | None = None,
    client: dict[str, Any] | None = None,
    s_out: Callable[[str], None] = lambda _: None,
    c_out: Callable[[str], None] = lambda _: None,
    raising: bool = True,
    **common: Any,
) -> tuple[Any, Any]:
    """A tool's server (first CA, in a thread) and client (second CA) on one fresh port.

    ``run`` and ``options`` are the tool's; ``common`` goes to both ends' options,
    ``server``/``client`` to one.  Returns (server result, client result); an end's
    exception is raised (the client's first), or with ``raising=False`` returned
    in its place.
    """
    server_dev, client_dev = ca_names(al)[:2]
    listener = socket.create_server(("127.0.0.1", 0), backlog=1)
    port = listener.getsockname()[1]
    outcome: dict[str, Any] = {}

    def end(name: str, opts: Any, out: Callable[[str], None], **kw: Any) -> None:
        try:
            outcome[name] = run(al, opts, out=out, **kw)
        except Exception as exc:  # handed to the test
            outcome[name] = exc

    sopts = options(device=server_dev, port=port, **common, **(server or {}))
    copts = options(servername="127.0.0.1", device=client_dev, port=port, **common,
                    **(client or {}))  # fmt: skip
    t = threading.Thread(target=end, args=("server", sopts, s_out), kwargs={"listener": listener})
    t.start()
    try:
        end("client", copts, c_out)
    finally:
        t.join(60)
    assert not t.is_alive(), "the server end did not finish"
    pair = outcome["server"], outcome["client"]
    for res in reversed(pair) if raising else ():
        if isinstance(res, BaseException):
            raise res
    return pair
