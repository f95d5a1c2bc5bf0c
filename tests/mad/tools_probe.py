"""Run under umad2sim: several ``ibal`` commands in one process (the CLI entry point).

stdin: a JSON list of argument lists; stdout (last line): a JSON list of
``{"code", "stdout", "stderr"}``.  ``test_tools_ibsim.py`` compares them with
infiniband-diags.

The commands share one access layer and one MAD client per ``--via`` (the
CLI's port opener is replaced by one handing out the shared client): opening
and closing the umad CA again and again in one process crashes umad2sim
(seen: SIGSEGV in the rdma_core provider's receive thread's ``poll``), and a
real command runs once per process anyway.  Argument parsing, target
resolution, the queries and the output are the CLI's own.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterator
from typing import Any

import ibal
from ibal import cli
from ibal.mad.rpc import MadClient, MadError, pick_port


def main() -> int:
    cmds: list[list[str]] = json.load(sys.stdin)
    al = ibal.open_al()
    clients: dict[str, MadClient] = {}

    @contextlib.contextmanager
    def shared(providers: Any, options: Any, ca_name: str | None, port_num: int | None,
               timeout_ms: int, via: str) -> Iterator[MadClient]:  # fmt: skip
        if via not in clients:
            clients[via] = MadClient(pick_port(al, ca_name, port_num, via=via),
                                     timeout_ms=timeout_ms)  # fmt: skip
        try:
            yield clients[via]
        except MadError as exc:
            raise cli.click.ClickException(str(exc)) from exc

    cli._mad_client = shared  # type: ignore[assignment]
    results = []
    for args in cmds:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main.main(args, prog_name="ibal", standalone_mode=True)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    for c in clients.values():
        c.close()
    al.close()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
