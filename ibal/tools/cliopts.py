"""What the ``ibal`` commands share: provider start-up, ``-o`` options, the diagnostics'
common options and MAD client, the consoles.

It sits in the tools' layer so that the tools' own command modules and
:mod:`ibal.cli` (which only dispatches) use one copy; nothing here imports a tool.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from ibal.status import IbError

if TYPE_CHECKING:  # rich is imported by the commands that print tables (~0.1 s)
    from rich.console import Console

    from ibal.al import AccessLayer, AlManager

__all__ = [
    "DIAG_OPTS", "PROVIDER_HELP", "console", "diag_options", "err_console", "m_key_value",
    "mad_client", "node_name_map_option", "open_al", "parse_options", "resolve_target",
    "tool_providers",
]  # fmt: skip


class _LazyConsole:
    """A console made at first use, so ``COLUMNS`` set by a caller (or test) is honoured."""

    def __getattr__(self, name: str) -> object:
        from rich.console import Console

        return getattr(Console(), name)


class _LazyErrConsole:
    def __getattr__(self, name: str) -> object:
        from rich.console import Console

        return getattr(Console(stderr=True), name)


console: Console = _LazyConsole()  # type: ignore[assignment]
err_console: Console = _LazyErrConsole()  # type: ignore[assignment]
"""Errors and notes: standard error, so a script reading the tables is not misled."""


def parse_options(pairs: tuple[str, ...]) -> dict[str, object]:
    options: dict[str, object] = {}
    if not pairs:
        return options
    import json  # ~2 ms: only when there are options

    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


@contextmanager
def open_al(
    providers: tuple[str, ...], options: dict[str, object]
) -> Iterator[tuple[AlManager, AccessLayer]]:
    """Start the named providers (default: what ``ibal.open_al()`` starts) and open an AL.

    A provider named with ``-p`` that cannot start, or finds no device, is an
    error (``click.ClickException``: message on stderr, exit status 1); of the
    default set, those are only recorded in ``mgr.unavailable``.
    """
    # the access layer only here: a diagnostic on the lean MAD path never loads it
    from ibal.al import AlManager, start_default_providers

    mgr = AlManager()
    if providers:
        for name in providers:
            try:
                mgr.start_provider(name, options)
            except (IbError, ValueError, TypeError) as exc:
                detail = exc.detail if isinstance(exc, IbError) else ""
                mgr.unavailable[name] = detail or str(exc)
        failed = [f"{n}: {r}" for n, r in sorted(mgr.unavailable.items()) if n in providers]
        if failed:
            mgr.close()
            raise click.ClickException("; ".join(f"provider {f}" for f in failed))
    else:
        start_default_providers(mgr)
    al = mgr.open_al()
    try:
        yield mgr, al
    finally:
        al.close()
        mgr.close()


def tool_providers(providers: tuple[str, ...]) -> tuple[str, ...]:
    """``--provider`` names, else ``IBAL_PROVIDERS`` (comma separated), else the defaults."""
    import os

    if providers:
        return providers
    env = os.environ.get("IBAL_PROVIDERS", "")
    return tuple(n.strip() for n in env.split(",") if n.strip())


PROVIDER_HELP = "Provider to run on (repeatable; default IBAL_PROVIDERS, else the real ones)."


DIAG_OPTS = [
    click.option("-C", "--Ca", "ca_name", help="CA name or GUID [default: the first with an "
                 "active port]."),
    click.option("-P", "--Port", "port_num", type=int, help="CA port [default: the first active]."),
    click.option("-t", "--timeout", "timeout_ms", type=int, default=500, show_default=True,
                 help="Response time-out per try (ms)."),
    # bare agents by default: the client matches answers and retries itself, so the
    # MAD service's elements, and importing it (~15% of smpquery's CPU), only cost
    click.option("--via", type=click.Choice(["service", "agent"]), default="agent",
                 show_default=True, help="MADs through the MAD service or bare AL agents."),
    click.option("--provider", "providers", multiple=True, help=PROVIDER_HELP),
    click.option("-o", "--option", "options", multiple=True, help="Provider option KEY=VALUE."),
    click.option("--json", "as_json", is_flag=True,
                 help="Machine-readable output (schema: docs/tools.md)."),
    click.option("-y", "--m_key", "m_key", metavar="KEY",
                 help="The M_Key every SMP carries (a word that is no number: asked for)."),
]  # fmt: skip


def m_key_value(text: str | None) -> int:
    """``-y``'s key: a number as ``strtoull(.., 0)`` reads it; a word that is no number
    is asked for, unechoed, as the C tools ask; 0 without the option."""
    if text is None:
        return 0
    try:
        # strtoull's bases: 0x hex, a leading 0 octal (Python's int(.., 0) refuses "010")
        t = text.strip()
        value = int(t, 8) if len(t) > 1 and t[0] == "0" and t[1] in "01234567" else int(t, 0)
    except ValueError:
        import getpass

        try:
            value = int(getpass.getpass("M_Key to use: "), 0)
        except ValueError:
            raise click.BadParameter("not a number", param_hint="-y") from None
    if not 0 <= value < 1 << 64:
        raise click.BadParameter("an M_Key is 64 bits", param_hint="-y")
    return value


def diag_options(fn: Any, via: str = "agent") -> Any:
    for opt in reversed(DIAG_OPTS):
        fn = opt(fn)
    if via != "agent":  # the --via default of this command
        param = next(p for p in fn.__click_params__ if p.name == "via")
        param.default = via
    return fn


def node_name_map_option(fn: Any) -> Any:
    """``--node-name-map FILE`` (``ibal.tools.nodemap``), passed on as ``node_name_map``."""
    from pathlib import Path

    return click.option("--node-name-map", "node_name_map", type=click.Path(path_type=Path),
                        help="Names for node GUIDs, infiniband-diags' node-name-map file "
                        "[default: /etc/rdma/ib-node-name-map when it exists].")(fn)  # fmt: skip


@contextmanager
def _client_on(port: Any, timeout_ms: int, m_key: int) -> Iterator[Any]:
    """A MadClient on ``port`` for the ``with`` block; its MadError exits with status 1."""
    from ibal.mad.rpc import MadClient, MadError

    client = MadClient(port, timeout_ms=timeout_ms, m_key=m_key)
    try:
        yield client
    except MadError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        client.close()


@contextmanager
def mad_client(
    providers: tuple[str, ...], options: tuple[str, ...], ca_name: str | None,
    port_num: int | None, timeout_ms: int, via: str, *, lean: bool = True,
    m_key: str | None = None,
) -> Iterator[Any]:  # fmt: skip
    """A :class:`~ibal.mad.rpc.MadClient` on the chosen port (errors: exit status 1).

    With the defaults (no ``--provider``, ``-o`` or ``IBAL_PROVIDERS``, ``--via
    agent``) and libibumad serving a CA, the client's port is a
    :class:`~ibal.tools.leanport.UmadMadPort` straight on libibumad, without the
    access layer (docs/performance.md, "Start-up of the diagnostics"); else the
    port :func:`~ibal.mad.rpc.pick_port` finds on an AL (always with ``lean=False``:
    a caller that needs the port's AL CA, e.g. a ping server).  ``m_key``: ``-y``'s
    text, the M_Key of every SMP.
    """
    from ibal.mad.rpc import MadError, pick_port

    key = m_key_value(m_key)

    if lean and via == "agent" and not providers and not options:
        import os

        if not os.environ.get("IBAL_PROVIDERS"):
            from ibal.tools.leanport import lean_port

            try:
                umad_port = lean_port(ca_name, port_num)
            except MadError as exc:
                raise click.ClickException(str(exc)) from exc
            if umad_port is not None:
                with _client_on(umad_port, timeout_ms, key) as client:
                    yield client
                return
    with open_al(tool_providers(providers), parse_options(options)) as (_, al):
        try:
            port = pick_port(al, ca_name, port_num, via=via)
        except MadError as exc:
            raise click.ClickException(str(exc)) from exc
        with _client_on(port, timeout_ms, key) as client:
            yield client


def resolve_target(client: Any, text: str, directed: bool, by_guid: bool) -> Any:
    from ibal.mad.rpc import parse_portid

    try:
        if by_guid:
            return client.resolve_guid(int(text, 16))
        return parse_portid(text, directed=directed)
    except ValueError as exc:
        raise click.ClickException(f"can't resolve destination port {text}: {exc}") from exc
