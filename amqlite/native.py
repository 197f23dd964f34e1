"""Which build of the broker's hot path runs: compiled by mypyc, or pure Python.

``pip install .`` compiles ``HOT_MODULES`` (setup.py) when a C compiler and the Python
headers are there; otherwise, or with ``AMQLITE_PURE_PYTHON=1`` at install time, they
stay pure Python. Both builds run the same source: the compiled one is ``mypyc``'s
translation of these ``.py`` files. setup.py reads this file by path, so it imports
nothing of amqlite.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

#: Set (to anything but 0) while installing to get the pure-Python build.
PURE_ENV = "AMQLITE_PURE_PYTHON"

#: The event loop's per-message path, compiled together (calls between them are C
#: calls). Chosen by bench/loop_bench.py (bench/README.md, "Issue 25, session 10: the
#: hot path compiled with mypyc" and "Issue 25, session 11: the rest of the loop's
#: per-message path compiled"). The server, the broker's core, its memory budget and
#: the store's write buffer are in since session 11: their tests no longer build or
#: wrap them attribute by attribute, which a compiled class does not allow.
HOT_MODULES = (
    "amqlite.codec",
    "amqlite.frame_rules",  # the codec's limits and ProtocolError, split off for its size
    "amqlite.protocol",
    "amqlite.validation",
    "amqlite.server",
    "amqlite.broker.core",
    "amqlite.broker.memory",
    "amqlite.broker.send",
    "amqlite.broker.acks",
    "amqlite.broker.dispatch",
    "amqlite.broker.receipts",
    "amqlite.broker.subscription",
    "amqlite.broker.message",
    "amqlite.broker.source",
    "amqlite.broker.counters",
    "amqlite.broker.session",
    "amqlite.broker.routing",
    "amqlite.broker.temporary",  # its _Gone is a Source: interpreted cannot subclass compiled
    "store.write_buffer",
    # The group committer's thread (bench/README.md, "Issue 25, session 11"). Not
    # store.batch_commit: a mixin of SqlStore, whose other bases are not compiled.
    "store.group_commit",
    "store.pg_batch",
    "store.pg_pipeline",
    "store.pg_arrays",
)

COMPILED, PURE = "compiled (mypyc)", "pure Python"


def is_compiled(module: str) -> bool:
    """True when ``module`` would be imported from a C extension. Nothing is imported:
    ``find_spec`` of a submodule imports its parent packages (``amqlite.broker``'s
    ``__init__`` is the whole broker, 0.5 s for ``amqlite --version``), so this looks
    where Python's own finder would, in the top package's directories, where an
    extension module beside a ``.py`` wins."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return spec.origin is not None and spec.origin.endswith(tuple(EXTENSION_SUFFIXES))
    parts = rest.split(".")
    for base in spec.submodule_search_locations or ():
        folder = Path(base).joinpath(*parts[:-1])
        if any((folder / (parts[-1] + suffix)).is_file() for suffix in EXTENSION_SUFFIXES):
            return True
    return False


def implementation() -> str:
    """``COMPILED``, ``PURE``, or which modules are compiled when only some are."""
    compiled = [m for m in HOT_MODULES if is_compiled(m)]
    if not compiled:
        return PURE
    if len(compiled) == len(HOT_MODULES):
        return COMPILED
    return "partly compiled: " + ", ".join(compiled)


def compiled_in_source_tree(package_dir: Path) -> list[Path]:
    """Compiled modules beside their ``.py`` in a source checkout (one with setup.py):
    they would be imported instead of the ``.py``, so an edit would not run."""
    root = package_dir.parent
    if not (root / "setup.py").exists():
        return []  # an installed package: the build put both there, from one source
    found: list[Path] = []
    for module in HOT_MODULES:
        py = root.joinpath(*module.split(".")).with_suffix(".py")
        found += [p for s in EXTENSION_SUFFIXES for p in [py.with_suffix(s)] if p.exists()]
    return found
