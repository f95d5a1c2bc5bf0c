"""cffi builder (API mode, out of line) of ``ibal.providers.rxe._fastpath`` from fastpath.c.

Used by setup.py (``cffi_modules``) and by the sanitizer build of ``.ci/run``;
``CFLAGS``/``LDFLAGS`` from the environment reach the compiler as usual.  The
build carries :func:`source_digest` of the sources it was made from, so a
module older than its source (a checkout updated without a rebuild) is found
and set aside at load time instead of failing on a missing function.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "ibal.providers.rxe._fastpath"
SOURCES = ("fastpath.h", "fastpath.c")


def source_digest() -> str:
    """A digest of the C sources (and of this builder) a build is made from."""
    h = hashlib.sha256()
    for name in (*SOURCES, Path(__file__).name):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


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
    from cffi import FFI

    ffi = FFI()
    ffi.cdef((HERE / "fastpath.h").read_text() + "const char *rxe_source_digest(void);\n")
    ffi.set_source(
        MODULE,
        '#include <stdint.h>\n#include <stddef.h>\n#include "fastpath.h"\n'
        f'const char *rxe_source_digest(void) {{ return "{source_digest()}"; }}\n',
        sources=[_path(HERE / "fastpath.c", absolute)],
        include_dirs=[_path(HERE, absolute)],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
    )
    return ffi


# setup.py's cffi_modules executes this file as ``__cffi__`` and reads ``ffibuilder``;
# an import (source_digest() at run time) builds nothing and needs no cffi.
if __name__ in ("__cffi__", "__main__"):
    ffibuilder = builder()
if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
