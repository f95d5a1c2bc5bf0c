"""Finding and importing pyverbs, Debian's Python binding of rdma-core.

pyverbs is not on PyPI: Debian ships it as ``python3-pyverbs`` in
``/usr/lib/python3/dist-packages``, built for Debian's own Python (3.11 on
bookworm).  An interpreter with the same extension ABI (pyenv's 3.11, a venv
made from ``/usr/bin/python3``) can load it, but does not look there.

:func:`load` imports it in this order:

1. ``import pyverbs`` as is (a venv with ``--system-site-packages`` from
   ``/usr/bin/python3``, or ``PYTHONPATH`` set by the user);
2. otherwise, if ``$IBAL_PYVERBS_DIR`` or ``/usr/lib/python3/dist-packages``
   holds a ``pyverbs`` package built for this interpreter's ABI, a narrow
   :class:`importlib.abc.MetaPathFinder` is appended to ``sys.meta_path`` that
   answers for the top-level name ``pyverbs`` only.  Nothing else from
   dist-packages becomes importable (``sys.path`` is not touched), and a
   pyverbs found the normal way always wins because the finder comes last.

pyverbs' ``base`` module calls ``logging.basicConfig()`` when imported, which
would make the root logger of the importing program print to stderr.  The
import is wrapped so that the root logger's handlers and level are restored.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
"""Where Debian's python3-pyverbs installs the package."""

PYVERBS_DIR_ENV = "IBAL_PYVERBS_DIR"
"""A directory holding the ``pyverbs`` package, tried before the Debian one."""

DEBIAN_PACKAGE = "python3-pyverbs"

_lock = threading.Lock()


class PyverbsUnavailable(ImportError):
    """pyverbs cannot be imported; the message says why and what to install."""


class PyverbsFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level ``pyverbs`` package in one directory, and nothing else.

    Submodules (``pyverbs.qp``, ...) are found by the regular path finder
    through the package's ``__path__``.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pyverbs":
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.directory)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.directory)!r})"


def _candidates() -> list[Path]:
    dirs = []
    env = os.environ.get(PYVERBS_DIR_ENV)
    if env:
        dirs.append(Path(env))
    dirs.append(DEBIAN_DIST_PACKAGES)
    return dirs


def abi_mismatch(package_dir: Path) -> str | None:
    """Why the compiled modules in ``package_dir`` cannot load here, or None.

    Looks at the ``*.cpython-XY-...so`` names against this interpreter's
    extension suffixes.
    """
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    built = sorted({p.name.split(".", 1)[1] for p in package_dir.glob("*.so") if "." in p.name})
    if not built:
        return f"{package_dir} holds no compiled modules"
    if any(b in (s.lstrip(".") for s in suffixes) for b in built):
        return None
    tags = ", ".join(b.rsplit(".", 1)[0] for b in built)
    me = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"{package_dir} is built for {tags}, this interpreter is Python {me} "
        f"({sys.executable}); use Python {_python_of(built[0])} or a venv made with "
        "`/usr/bin/python3 -m venv --system-site-packages`"
    )


def _python_of(suffix: str) -> str:
    """``cpython-311-x86_64-linux-gnu.so`` -> ``3.11``."""
    m = re.match(r"cpython-(\d)(\d+)", suffix)
    return f"{m.group(1)}.{m.group(2)}" if m else suffix


def _installed_finder() -> PyverbsFinder | None:
    for finder in sys.meta_path:
        if isinstance(finder, PyverbsFinder):
            return finder
    return None


def _import_quietly() -> ModuleType:
    """``import pyverbs`` and its modules the provider uses, undoing basicConfig."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        pyverbs = importlib.import_module("pyverbs")
        for sub in ("enums", "device", "pd", "cq", "qp", "srq", "mr", "wr", "addr", "base"):
            importlib.import_module(f"pyverbs.{sub}")
        importlib.import_module("pyverbs.pyverbs_error")
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    return pyverbs


def load() -> ModuleType:
    """Import pyverbs (see the module docstring); raise :class:`PyverbsUnavailable`."""
    with _lock:
        mod = sys.modules.get("pyverbs")
        if mod is not None and "pyverbs.qp" in sys.modules:
            return mod
        try:
            return _import_quietly()
        except ImportError as exc:
            first: ImportError = exc
        if _installed_finder() is not None:
            raise PyverbsUnavailable(f"pyverbs not importable: {first}") from first
        problems = []
        for directory in _candidates():
            package = directory / "pyverbs"
            if not (package / "__init__.py").is_file():
                problems.append(f"no {package}")
                continue
            mismatch = abi_mismatch(package)
            if mismatch:
                problems.append(mismatch)
                continue
            finder = PyverbsFinder(directory)
            sys.meta_path.append(finder)
            try:
                return _import_quietly()
            except ImportError as exc:
                sys.meta_path.remove(finder)
                for name in [n for n in sys.modules if n == "pyverbs" or n.startswith("pyverbs.")]:
                    del sys.modules[name]
                problems.append(f"{package}: {exc}")
        detail = "; ".join(problems)
        raise PyverbsUnavailable(
            f"{first} ({detail}); install the Debian package {DEBIAN_PACKAGE} "
            f"(apt-get install {DEBIAN_PACKAGE})"
        ) from first


def pyverbs_error_types() -> tuple[type[BaseException], type[BaseException], type[BaseException]]:
    """``(PyverbsError, PyverbsRDMAError, PyverbsUserError)`` of the loaded pyverbs."""
    err: Any = importlib.import_module("pyverbs.pyverbs_error")
    return err.PyverbsError, err.PyverbsRDMAError, err.PyverbsUserError
