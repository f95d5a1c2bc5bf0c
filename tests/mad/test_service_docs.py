"""The example in docs/mad.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "mad.md"


def test_the_mad_service_example_runs() -> None:
    text = DOC.read_text()
    section = text[text.index("## The MAD service") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    exec(compile(code.group(1), str(DOC), "exec"), {})
