"""The example of docs/pnp.md runs as written on the mock: one line per active port."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "pnp.md"


def test_port_client_example_prints_each_active_port() -> None:
    text = DOC.read_text()
    start = text.index("## Example: a client of every port")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(m.group(1), str(DOC), "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines and all(re.fullmatch(r"port 0x[0-9a-f]{16} active, LID 0x[0-9a-f]+", ln)
                         for ln in lines), lines
    assert len(set(lines)) == len(lines)
