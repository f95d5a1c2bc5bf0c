"""cffi builder (API mode, out of line) of ``ibal.providers.rxe._fastpath`` from fastpath.c.

Used by setup.py (``cffi_modules``) and by the sanitizer build of ``.ci/run``;
``CFLAGS``/``LDFLAGS`` from the environment reach the compiler as usual.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "ibal.providers.rxe._fastpath"


def _path(p: Path, absolute: bool) -> str:
    """``p`` relative to the working directory where it can be (setuptools wants that;
    ``FFI.compile`` builds in another directory and wants it absolute)."""
    if absolute:
        return str(p)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def builder(absolute: bool = False) -> FFI:
    """The FFI builder: fastpath.h as the cdef, fastpath.c as the one source."""
    ffi = FFI()
    ffi.cdef((HERE / "fastpath.h").read_text())
    ffi.set_source(
        MODULE,
        '#include <stdint.h>\n#include <stddef.h>\n#include "fastpath.h"',
        sources=[_path(HERE / "fastpath.c", absolute)],
        include_dirs=[_path(HERE, absolute)],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
    )
    return ffi


ffibuilder = builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
