"""amqlite: a highly available STOMP 1.2 broker with shared-store master/slave election."""

from pathlib import Path as _Path

from amqlite.native import compiled_in_source_tree as _compiled_in_source_tree

__version__ = "0.1.0"

if _stale := _compiled_in_source_tree(_Path(__file__).parent):
    # mypyc or `setup.py build_ext --inplace` run by hand: the extension would be
    # imported instead of the .py beside it, so edits to that .py would not run.
    raise ImportError(f"compiled modules in the source tree shadow their .py files: "
                      f"{', '.join(str(p) for p in _stale)} (delete them: pip install . "
                      f"builds the compiled ones into site-packages)")
