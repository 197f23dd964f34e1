"""The build compiles the broker's hot path with mypyc (setup.py, amqlite/native.py): the
compiled modules pass the codec's, protocol's, broker's and group committer's tests (the
latter against a real PostgreSQL), agree with pure Python on
the codec's fixed cases and say which build they are; without a C compiler, with
AMQLITE_PURE_PYTHON=1 or in place, the build is pure Python with one warning; a compiled
module left in a source tree is refused at import, not run instead of its edited .py.

The suite itself runs the source tree (pure Python, as an editable install does), so this
is where the compiled build meets the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from amqlite.native import COMPILED, HOT_MODULES, PURE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
#: mypy's check of the package and gcc: ~1 min on a quiet 2-core VM, ~3 under load.
BUILD_TIMEOUT = 900
#: What the build reads (the Dockerfile copies the same).
SOURCES = ("amqlite", "store", "lockers", "cli", "spark", "setup.py", "pyproject.toml",
           "README.md", "docs/openapi.yaml")
#: The in-process tests of the compiled modules.
SUITES = ("tests/unit/test_codec.py", "tests/unit/test_codec_big_frames.py",
          "tests/unit/test_protocol.py",
          "tests/unit/test_protocol_client.py", "tests/unit/test_protocol_heartbeat.py",
          "tests/unit/test_protocol_hold.py", "tests/unit/test_protocol_state.py",
          "tests/unit/test_validation.py", "tests/unit/test_wire.py",
          "tests/unit/test_preauth_eviction.py", "tests/unit/test_malloc_trim.py", "tests/broker",
          "tests/store/test_group_commit.py", "tests/store/test_pg_batch.py",
          "tests/store/test_pg_arrays.py", "tests/store/test_store_rejected.py")
SUITE_TIMEOUT = 600
WARNING = "WARNING: amqlite:"


def source_copy(dest: Path) -> Path:
    """The sources as a fresh checkout has them (no caches, no build output)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info")
    for name in SOURCES:
        src, dst = ROOT / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, dst)
    return dest


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CC", "AMQLITE_PURE_PYTHON")}
    return {**env, **extra}


def build(src: Path, out: Path, *command: str, **env: str) -> subprocess.CompletedProcess[str]:
    argv = list(command) or ["build", "--build-base", str(out / "tmp"),
                             "--build-lib", str(out / "lib")]
    return subprocess.run([sys.executable, "setup.py", *argv], cwd=src, env=environ(**env),
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT)


def compiled_files(where: Path) -> list[Path]:
    return sorted(p for p in where.rglob("*.so") if "tmp" not in p.relative_to(where).parts)


def run_python(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environ(PYTHONPATH=str(path)),
                          capture_output=True, text=True, timeout=SUITE_TIMEOUT)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled build's importable tree (what a wheel puts into site-packages)."""
    src = source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("out")
    # What an earlier build with another HOT_MODULES left (pip builds in the tree's
    # build/): it must not reach the wheel, where it would be imported instead of the .py.
    (out / "lib" / "amqlite" / "broker").mkdir(parents=True)
    stale_name = "core" + EXTENSION_SUFFIXES[0]
    (out / "lib" / "amqlite" / "broker" / stale_name).write_bytes(b"stale")
    result = build(src, out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert WARNING not in result.stderr, result.stderr[-3000:]
    assert compiled_files(src) == [], "the build wrote into the source tree"
    return out / "lib"


def test_the_build_compiles_every_hot_module_and_says_so(compiled: Path,
                                                        tmp_path: Path) -> None:
    names = sorted(p.name.split(".")[0] for p in compiled_files(compiled))
    assert names == sorted([m.rsplit(".", 1)[-1] for m in HOT_MODULES] + ["amqlite_hot__mypyc"])
    version = run_python(compiled, "-m", "cli", "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().endswith(f"({COMPILED})")
    pure = run_python(ROOT, "-m", "cli", "--version", cwd=tmp_path)
    assert pure.stdout.strip().endswith(f"({PURE})"), pure.stdout


def test_both_builds_agree_on_the_codecs_cases(compiled: Path, tmp_path: Path) -> None:
    script = str(ROOT / "tests" / "helpers" / "codec_golden.py")
    runs = {}
    for name, path in (("compiled", compiled), ("pure", ROOT)):
        out = run_python(path, script, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        runs[name] = json.loads(out.stdout)
    assert runs["compiled"]["compiled"] is True and runs["pure"]["compiled"] is False
    assert runs["compiled"]["cases"] == runs["pure"]["cases"]


def test_the_compiled_build_passes_the_hot_paths_tests(compiled: Path, tmp_path: Path) -> None:
    # amqlite is imported from the compiled tree first; the repository is appended to the
    # path only for the tests package (--import-mode=append), so it cannot shadow it.
    code = ("import sys, pytest, amqlite.codec as c, store.pg_batch as b; "
            "assert c.__file__.endswith('.so') and b.__file__.endswith('.so'), "
            "(c.__file__, b.__file__); "
            "sys.exit(pytest.main(sys.argv[1:]))")
    args = ["-q", "-p", "no:cacheprovider", "--import-mode=append", f"--rootdir={ROOT}",
            "-c", str(ROOT / "pyproject.toml"), *(str(ROOT / s) for s in SUITES)]
    out = run_python(compiled, "-c", code, *args, cwd=tmp_path)
    failures = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR", "E "))]
    assert out.returncode == 0, "\n".join(failures)[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


#: Real broker processes of the compiled build: the server's handshake, refusals and
#: limits, and stomp.py as the third-party client.
BROKER_SUITES = ("tests/integration/test_stomp_compat.py",
                 "tests/integration/test_preauth_limits.py",
                 "tests/integration/test_edge_validation.py")


def test_the_compiled_broker_passes_the_servers_integration_tests(compiled: Path,
                                                                 tmp_path: Path) -> None:
    # The broker harness runs `python -m cli` in the tests' repository root, so the tests
    # run from a copy beside the compiled tree: their brokers import the compiled modules.
    tree = tmp_path / "tree"
    shutil.copytree(compiled, tree)
    shutil.copytree(ROOT / "tests", tree / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", tree / "pyproject.toml")
    code = ("import sys, pytest, amqlite.server as s; "
            "assert s.__file__.endswith('.so'), s.__file__; "
            "sys.exit(pytest.main(sys.argv[1:]))")
    out = run_python(tree, "-c", code, "-q", "-p", "no:cacheprovider", *BROKER_SUITES,
                     cwd=tree)
    failures = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR", "E "))]
    assert out.returncode == 0, "\n".join(failures)[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


@pytest.mark.parametrize("env, reason", [
    ({"CC": "/nonexistent/cc"}, "no C compiler"),
    ({"AMQLITE_PURE_PYTHON": "1"}, "AMQLITE_PURE_PYTHON is set"),
])
def test_a_build_that_cannot_compile_is_pure_python_with_one_warning(
        tmp_path: Path, env: dict[str, str], reason: str) -> None:
    src = source_copy(tmp_path / "src")
    stale = tmp_path / "out" / "lib" / "amqlite" / ("codec" + EXTENSION_SUFFIXES[0])
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")  # an earlier compiled build's, in the same build directory
    result = build(src, tmp_path / "out", **env)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [ln for ln in result.stderr.splitlines() if WARNING in ln]
    assert len(warnings) == 1 and reason in warnings[0], result.stderr[-3000:]
    lib = tmp_path / "out" / "lib"
    assert (lib / "amqlite" / "codec.py").exists() and compiled_files(lib) == []
    version = run_python(lib, "-m", "cli", "--version", cwd=tmp_path)
    assert version.stdout.strip().endswith(f"({PURE})"), version.stdout + version.stderr


def test_an_in_place_build_compiles_nothing_into_the_source_tree(tmp_path: Path) -> None:
    src = source_copy(tmp_path / "src")
    result = build(src, tmp_path, "build_ext", "--inplace")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "in-place build" in result.stderr and compiled_files(src) == []


def test_a_compiled_module_left_in_a_source_tree_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "amqlite").mkdir(parents=True)
    for name in ("__init__.py", "native.py", "codec.py"):
        shutil.copy2(ROOT / "amqlite" / name, tree / "amqlite" / name)
    stale = tree / "amqlite" / "codec.cpython-311-x86_64-linux-gnu.so"
    stale.write_bytes(b"")  # never loaded: the package refuses before
    (tree / "setup.py").write_text("")
    out = run_python(tree, "-c", "import amqlite", cwd=tmp_path)
    assert out.returncode != 0
    assert "compiled modules in the source tree shadow their .py files" in out.stderr
    assert str(stale) in out.stderr
    (tree / "setup.py").unlink()  # an installed package: both come from one build
    assert run_python(tree, "-c", "import amqlite", cwd=tmp_path).returncode == 0
