"""Builds amqlite, compiling the broker's typed per-message path with mypyc when it can.

The modules in ``amqlite.native.HOT_MODULES`` are compiled to C extensions (mypyc, as
mypy and black ship) for ``pip install .``: 40-50 % of the event loop's CPU per durable
message (bench/README.md, "Issue 25, session 10: the hot path compiled with mypyc").
Everything else, and everything when the build cannot compile, is the same pure Python:
no C compiler or Python headers, mypyc failing, or ``AMQLITE_PURE_PYTHON=1`` give a
pure-Python install with one warning on the build's output (``amqlite --version`` says
which one is installed).

Only wheels are compiled, never an editable install (``pip install -e``) or the source
tree: a compiled module next to its ``.py`` would be imported instead of it, and an
edit to the ``.py`` would silently not run.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# amqlite/native.py by path: importing amqlite here would import the source tree's.
NATIVE = runpy.run_path(str(Path(__file__).resolve().parent / "amqlite" / "native.py"))
HOT_MODULES: tuple[str, ...] = NATIVE["HOT_MODULES"]
PURE_ENV: str = NATIVE["PURE_ENV"]

#: setup.py commands that make a wheel or install one; egg_info, dist_info (pip's
#: metadata steps), sdist and editable_wheel (``pip install -e``) compile nothing.
COMPILING_COMMANDS = {"bdist_wheel", "build", "build_ext", "install"}


def warn(message: str) -> None:
    print(f"WARNING: amqlite: {message}; installing the pure-Python build", file=sys.stderr)


def why_not_compiled() -> str | None:
    """Why this build stays pure Python (None: compile)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    if "--inplace" in sys.argv or "-i" in sys.argv:
        return "an in-place build would put compiled modules into the source tree"
    include = sysconfig.get_paths().get("include", "")
    if not Path(include, "Python.h").exists():
        return f"no Python headers ({include}/Python.h; Debian: python3-dev)"
    # $CC first, as setuptools' compiler does.
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}; Debian: gcc)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (mypy is a build requirement in pyproject.toml)"
    return None


def hot_extensions() -> list[Any]:
    """mypyc's extensions for the hot modules, or none (with one warning)."""
    if not COMPILING_COMMANDS & set(sys.argv[1:]):
        return []
    reason = why_not_compiled()
    if reason is not None:
        warn(reason)
        return []
    from mypyc.build import mypycify

    paths = [str(Path(*m.split(".")).with_suffix(".py")) for m in HOT_MODULES]
    try:
        # Third-party packages the build environment lacks are Any to mypyc; only the
        # compiled modules' own errors stop the build (they pass mypy strict anyway).
        return mypycify(["--ignore-missing-imports", "--follow-imports=silent", *paths],
                        target_dir=str(Path("build", "mypyc")), group_name="amqlite_hot")
    except BaseException as e:  # mypy's errors end in SystemExit
        warn(f"mypyc failed ({type(e).__name__}: {e})")
        return []


class BuildPackages(build_py):
    """build_py that also drops the extensions an earlier build left in the build
    directory (pip builds in the tree's build/): a module since dropped from
    HOT_MODULES, or every one of them before a pure-Python build, would go into the
    wheel and be imported instead of its .py. build_ext runs after it and puts back
    what this build compiles."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for path in Path(self.build_lib).rglob("*"):
            if path.name.endswith(tuple(EXTENSION_SUFFIXES)):
                path.unlink()


class BuildHotModules(build_ext):
    """build_ext that falls back to pure Python when the C compiler fails."""

    def run(self) -> None:
        if getattr(self, "editable_mode", False) or self.inplace:
            self.extensions = []  # never compiled into the source tree (see above)
        try:
            super().run()
        except Exception as e:  # CompileError, LinkError, a missing header ...
            warn(f"compiling the hot modules failed ({e})")
            for out in self.get_outputs():  # no half-built set: all compiled or none
                Path(out).unlink(missing_ok=True)


setup(ext_modules=hot_extensions(),
      cmdclass={"build_py": BuildPackages, "build_ext": BuildHotModules})
