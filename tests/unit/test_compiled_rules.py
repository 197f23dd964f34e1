"""Source rules for the modules mypyc compiles (``amqlite.native.HOT_MODULES``): code
that is correct Python but that the compiled build runs differently.

mypyc gives a name bound by several ``except ... as NAME`` clauses of one function the
type of the first clause: when that class is compiled too, a later clause catching a
wider class raises TypeError instead of handling the exception (mypy 2.4.1's mypyc;
seen in amqlite.server's ``_accept``, where a refused CONNECT got no ERROR). The same
shape in store.group_commit (StoreRejected, then StoreError) was safe only because
store.api is not compiled; compiling it would have made a lost store fail the
committer thread instead of demoting the node. The rule keeps such paths, which the
pure build's tests cannot see, out of every compiled module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from amqlite.native import HOT_MODULES

ROOT = Path(__file__).resolve().parents[2]


def _shared_except_names(tree: ast.AST) -> list[str]:
    """``function: name`` for each name bound by except clauses of different types."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        types: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.ExceptHandler) and node.name:
                caught = ast.unparse(node.type) if node.type else "BaseException"
                types.setdefault(node.name, set()).add(caught)
        found += [f"{fn.name}: {name} {sorted(t)}" for name, t in types.items() if len(t) > 1]
    return found


def test_no_except_name_is_shared_by_clauses_of_different_types() -> None:
    problems = []
    for module in HOT_MODULES:
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(), str(path))
        problems += [f"{module}.{p}" for p in _shared_except_names(tree)]
    assert not problems, "rename so each clause binds its own name: " + "; ".join(problems)


def test_the_rule_sees_a_shared_name() -> None:
    source = (
        "def f():\n"
        "    try:\n        pass\n"
        "    except KeyError as exc:\n        pass\n"
        "    except LookupError as exc:\n        pass\n"
    )
    assert _shared_except_names(ast.parse(source)) == ["f: exc ['KeyError', 'LookupError']"]
