"""One entry-point group, read without importing ``importlib.metadata`` where that is exact.

``importlib.metadata`` costs ~13 ms to import (``email``, ``csv``, ``zipfile``),
paid by every ``ibal`` command that starts the default providers.  Where the
only distribution finder is the standard path finder and every ``sys.path``
entry is a directory, its answer is what this module reads itself: the
``*.dist-info`` / ``*.egg-info`` directories of each path entry in order, one
distribution per normalised name (the first found), the group's section of
its ``entry_points.txt``.  Anything else (zip files or eggs on the path,
finders of other kinds) falls back to ``importlib.metadata``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import sys
from typing import Any, Protocol

_SUFFIXES = (".dist-info", ".egg-info")


class EntryPoint(Protocol):
    """What the provider manager uses of an entry point (``importlib.metadata``'s has it)."""

    name: str
    value: str

    def load(self) -> Any: ...


class _EntryPoint:
    """``name = module[:attr]`` of one distribution's ``entry_points.txt``."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value

    def load(self) -> Any:
        # as importlib.metadata: "module:attr.sub [extras]"; extras are not checked
        ref = self.value.split("[", 1)[0].strip()
        module, _, attrs = ref.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for attr in filter(None, attrs.strip().split(".")):
            obj = getattr(obj, attr)
        return obj

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r})"


def group(name: str) -> list[EntryPoint]:
    """The entry points of group ``name`` of every installed distribution, in path order."""
    found = _scan(name)
    if found is None:
        from importlib import metadata

        return list(metadata.entry_points(group=name))
    return found


def _scan(group_name: str) -> list[EntryPoint] | None:
    """The fast read, or ``None`` where it might differ from ``importlib.metadata``."""
    for finder in sys.meta_path:
        if hasattr(finder, "find_distributions") and finder is not importlib.machinery.PathFinder:
            return None
    seen: set[str] = set()
    out: list[EntryPoint] = []
    for entry in sys.path:
        path = entry or "."
        try:
            with os.scandir(path) as it:
                names = [e.name for e in it]  # directory order, as importlib.metadata
        except NotADirectoryError:
            return None  # a zip file or an egg: importlib.metadata reads those
        except OSError:
            continue  # a missing directory holds nothing, for importlib.metadata too
        if any(n.lower().endswith(".egg") for n in names):
            return None
        for dist in (n for n in names if n.lower().endswith(_SUFFIXES)):
            stem = os.path.splitext(dist)[0]
            key = re.sub(r"[-_.]+", "_", stem.partition("-")[0]).lower()
            if key in seen:
                continue
            seen.add(key)
            out.extend(_section(os.path.join(path, dist, "entry_points.txt"), group_name))
    return out


def _section(path: str, group_name: str) -> list[EntryPoint]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:  # no entry points (or an .egg-info file, not a directory)
        return []
    out: list[EntryPoint] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == group_name
            continue
        if inside:
            key, eq, value = line.partition("=")
            if eq:
                out.append(_EntryPoint(key.strip(), value.strip()))
    return out
