"""``--node-name-map``: infiniband-diags' file of friendlier names for node GUIDs.

The format is libibnetdisc's (rdma-core ``util/node_name_map.c``): one
``GUID "name"`` a line, the GUID as C's ``strtoull(.., 0)`` reads it, blank
lines and ``#`` lines skipped, the name the text up to a ``"`` or ``#`` after
the GUID (so quotes are optional); the first line of a GUID wins.  Without
the option the tools read ``/etc/rdma/ib-node-name-map`` when it exists, as
the C tools do.  A node the map does not name keeps its NodeDescription, its
unprintable characters made spaces (``clean_nodedesc``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Final

__all__ = ["DEFAULT", "NameMap", "apply", "clean", "load", "parse", "remap"]

DEFAULT: Final = Path("/etc/rdma/ib-node-name-map")
_LINE_MAX: Final = 255  # fgets into a 256-byte buffer: a longer line goes on as the next
_DESC_MAX: Final = 64

NameMap = dict[int, str]
# strtoull(p, &e, 0): optional sign, 0x hex, leading-0 octal, else decimal
_NUM = re.compile(r"[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def _strtoull(text: str) -> tuple[int, int] | None:
    """The number C's ``strtoull(text, &end, 0)`` reads and where it stops (None: none)."""
    m = _NUM.match(text)
    if m is None:
        return None
    body = m.group(1)
    value = int(body, 16) if body[:2] in ("0x", "0X") else int(body, 8) if body[0] == "0" \
        else int(body)  # fmt: skip
    if m.group(0).startswith("-"):
        value = -value
    return value % (1 << 64), m.end()


def _lines(raw: str) -> list[str]:
    """The file as fgets into 256 bytes hands it out: long lines cut into pieces."""
    out = []
    for line in raw.splitlines(keepends=True):
        while len(line) > _LINE_MAX:
            out.append(line[:_LINE_MAX])
            line = line[_LINE_MAX:]
        out.append(line)
    return out


def parse(text: str) -> NameMap:
    """A map file's names by GUID; ``ValueError(line)`` for a line that is not one."""
    names: NameMap = {}
    for line in _lines(text):
        p = line.lstrip()
        if not p or p[0] == "#":
            continue
        got = _strtoull(p)
        if got is None or (p[got[1]:got[1] + 1] not in ("", "#") and not p[got[1]].isspace()):
            raise ValueError(line.rstrip("\n"))
        guid, end = got
        rest = p[end:].lstrip().split("\n", 1)[0]
        # strtok(rest, "\"#"): the first run of characters that are neither
        name = next((t for t in re.split(r'["#]', rest) if t), None)
        if name is not None:
            names.setdefault(guid, name)
    return names


def load(path: Path | None) -> NameMap | None:
    """The map ``path`` holds (None: the default file, when it exists).

    A file that cannot be read or parsed is warned about on stderr in the C
    tools' words and gives no map (the tool goes on with the descriptions).
    """
    if path is None:
        if not DEFAULT.exists():
            return None
        path = DEFAULT
    try:
        text = path.read_bytes().decode("latin-1")
    except OSError as exc:
        print(f'WARNING failed to open node name map "{path}" ({exc.strerror})',
              file=sys.stderr)  # fmt: skip
        return None
    try:
        return parse(text)
    except ValueError as exc:
        print(f'WARNING failed to parse node name map "{path}"', file=sys.stderr)
        print(f'WARNING failed line: "{exc.args[0]}"', file=sys.stderr)
        return None


def clean(desc: str) -> str:
    """``clean_nodedesc``: at most 64 characters, the unprintable ones spaces."""
    return "".join(c if " " <= c <= "~" else " " for c in desc[:_DESC_MAX])


def remap(names: NameMap | None, guid: int, desc: str) -> str:
    """``remap_node_name``: the map's name for node ``guid``, else its cleaned description."""
    if names and guid in names:
        return names[guid]
    return clean(desc)


def apply(topology: Any, names: NameMap | None) -> None:
    """Give each node of a :class:`~ibal.mad.discover.Topology` its mapped name as ``desc``
    (for printing only: a cache written from it would keep the names)."""
    if not names:
        return
    for node in topology.nodes.values():
        node.desc = remap(names, node.guid, node.desc)
