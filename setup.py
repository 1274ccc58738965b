"""The optional compiled build of asyncbk's per-entry modules.

Everything about the package is in pyproject.toml; this file only adds the compiled
modules.  By default the package installs as pure Python.  With ``ASYNCBK_COMPILE=1``
in the environment of the install, the modules in ``asyncbk/_compiled_modules.txt`` are
compiled with Cython (their pure-Python sources are the reference, and stay in the
package as the fallback); when Cython or a C compiler is missing, the build says so
once and installs the pure-Python package, which does everything the compiled one
does.  ``asyncbk --version`` says which build is installed.  Why compiling is not the
default (it measured no faster here): docs/build.md.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
LIST = HERE / "src" / "asyncbk" / "_compiled_modules.txt"


def _modules() -> list[str]:
    names = []
    for line in LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def _say(message: str) -> None:
    print(f"asyncbk build: {message}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """Compile what can be compiled; a failure leaves the pure-Python module in place."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # compile the modules side by side
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        self._failed: list[str] = []
        self._first_error = ""
        try:
            super().run()
        except Exception as exc:  # no compiler at all (CompileError, PlatformError, OSError)
            _say(f"no compiled modules ({type(exc).__name__}: {exc}); "
                 "installing pure Python")
            return
        if self._failed:
            total = len(self.extensions)
            what = ("no compiled modules" if len(self._failed) == total
                    else f"{len(self._failed)} of {total} modules not compiled")
            _say(f"{what} (first error: {self._first_error}); their pure-Python sources "
                 "are used")

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._failed.append(ext.name)
            if not self._first_error:
                self._first_error = f"{type(exc).__name__}: {exc}"[:300]


def _extensions() -> list:
    if os.environ.get("ASYNCBK_COMPILE", "") in ("", "0"):
        return []  # the default: pure Python
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which((shlex.split(cc) or ["cc"])[0]) is None:
        _say(f"no C compiler ({cc!r} not found): installing pure Python")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _say("Cython is not installed: installing pure Python")
        return []
    from setuptools import Extension

    exts = [
        Extension(name, [str(Path("src", *name.split(".")).with_suffix(".py"))])
        for name in _modules()
    ]
    return cythonize(
        exts,
        language_level=3,
        quiet=True,
        nthreads=os.cpu_count() or 1,
        compiler_directives={
            # the sources are typed for mypy, not for C: an `int` annotation must not
            # become a C long, and a None where a value is typed must stay legal
            "annotation_typing": False,
            "binding": True,
            "embedsignature": False,
        },
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
