"""The one compiled part: the rxe engine's cffi module, optional.

Where gcc or the Python headers are missing the build of
``ibal.providers.rxe._fastpath`` fails, setup says so in one warning and ibal
installs as pure Python (``ibal.providers.rxe.fastpath`` falls back).
"""

from __future__ import annotations

import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext whose failure leaves a pure-Python install instead of none."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # the compiler or headers missing: any failure of the build
            self._skip(e)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            self._skip(e)

    _warned = False

    def _skip(self, e: Exception) -> None:
        # a failed extension also fails the editable install's copy step: one warning
        if self._warned:
            return
        self._warned = True
        print(
            f"WARNING: ibal's compiled rxe engine was not built ({e}); "
            "ibal installs as pure Python",
            file=sys.stderr,
        )


setup(
    cmdclass={"build_ext": OptionalBuildExt},
    cffi_modules=["ibal/providers/rxe/_fastpath_build.py:ffibuilder"],
)
