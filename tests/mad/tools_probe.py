"""Run under umad2sim: several ``ibal`` commands in one process (the CLI entry point).

stdin: a JSON list of argument lists; stdout (last line): a JSON list of
``{"code", "stdout", "stderr"}``.  ``test_tools_ibsim.py`` compares them with
infiniband-diags.  Each command opens and closes its own access layer and CA,
as a command of its own process does.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from ibal.cli import main as ibal_main


def run(args: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ibal_main.main(args, prog_name="ibal", standalone_mode=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> int:
    cmds: list[list[str]] = json.load(sys.stdin)
    results = [run(c) for c in cmds]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
