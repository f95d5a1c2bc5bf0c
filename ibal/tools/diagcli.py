"""What the infiniband-diags commands share on the command line: the port, ``--json``, RoCE.

A diagnostic runs on a :class:`~ibal.mad.rpc.MadClient` from :func:`fabric_client`,
which also refuses, in one line and exit status 1, a port whose link layer is
Ethernet: SMPs, subnet managers and LIDs have no meaning on RoCE.  ``--json``
output follows ``ibal/tools/schemas/<command>.schema.json`` (:func:`schema`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from ibal.mad.rpc import MadClient
from ibal.tools import cliopts

__all__ = ["SCHEMAS", "emit_json", "fabric_client", "fabric_options", "guid", "schema"]

SCHEMAS = Path(__file__).with_name("schemas")
_F = TypeVar("_F", bound=Callable[..., Any])


def fabric_options(via: str = "agent") -> Callable[[_F], _F]:
    """``-C``, ``-P``, ``-t``, ``--via``, ``--provider``, ``-o`` and ``--json``."""

    def wrap(fn: _F) -> _F:
        out: _F = cliopts.diag_options(fn, via=via)  # --json among them
        return out

    return wrap


def _link_layer(client: MadClient) -> str:
    port = client.port
    known = getattr(port, "link_layer", None)  # the lean path's port says it itself
    if known is not None:
        return str(known)
    ca = getattr(port, "ca", None)
    if ca is None:
        return "InfiniBand"
    for p in ca.query().ports:
        if p.port_num == getattr(port, "port_num", None):
            return str(p.link_layer.value)
    return "InfiniBand"


@contextmanager
def fabric_client(tool: str, kw: dict[str, Any], *, lean: bool = True) -> Iterator[MadClient]:
    """The command's MAD client (``kw``: the common options' values, taken out of it).

    ``tool`` names the command in the RoCE refusal; ``lean=False``: a port on an AL
    CA (see :func:`~ibal.tools.cliopts.mad_client`).
    """
    args = [kw.pop(k) for k in ("providers", "options", "ca_name", "port_num", "timeout_ms",
                                "via")]  # fmt: skip
    with cliopts.mad_client(*args, lean=lean, m_key=kw.pop("m_key", None)) as client:
        if _link_layer(client) == "Ethernet":
            raise click.ClickException(
                f"{tool}: no meaning on RoCE (the port is Ethernet: no subnet manager, "
                "no SMPs, no LIDs)")  # fmt: skip
        yield client


def guid(value: int) -> str:
    """A GUID in JSON: 16 hex digits (64-bit numbers do not survive every JSON reader)."""
    return f"0x{value:016x}"


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


# commands of one family print one shape
_SCHEMA_OF = {"ibhosts": "nodes", "ibswitches": "nodes", "ibrouters": "nodes",
              "ibnodes": "nodes", "ibstatus": "ibstat", "dump_lfts": "dump_fts",
              "dump_mfts": "dump_fts"}  # fmt: skip


def schema(command: str) -> dict[str, Any]:
    """The JSON Schema ``command --json`` output validates against."""
    name = _SCHEMA_OF.get(command, command)
    out: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return out
