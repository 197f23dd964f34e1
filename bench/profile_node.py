"""Run one amqlite node (``python -m cli ...``) under cProfile, every thread on its own.

Bench only: ``bench/peers.py`` starts a spawned amqlite through this when
``AMQLITE_BENCH_PROFILE`` names a directory (``AMQLITE_BENCH_PROFILE=DIR bench/load.py
--spawn postgres ...``), and never otherwise. At exit each thread's profile goes to
``DIR/<thread>.pstats`` and the CPU seconds of every thread of the process (from /proc)
to ``DIR/threads.json``, so a run says where the event loop and the committer spend
their time and how much each.

    python bench/profile_node.py DIR start --group g ...   # the arguments of ``cli``

cProfile roughly doubles the cost of a Python call: read its figures as shares and
call counts per message, not as the broker's speed.
"""

from __future__ import annotations

import atexit
import cProfile
import json
import os
import re
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def thread_cpu_seconds() -> dict[str, float]:
    """user+system CPU seconds of each thread of this process, by its name (comm)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        m = re.match(r"\d+ \((.*)\) (.*)", stat)
        if not m:
            continue
        fields = m.group(2).split()
        name = f"{m.group(1)}[{task.name}]"
        out[name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print("usage: python bench/profile_node.py DIR <the arguments of cli>", file=sys.stderr)
        raise SystemExit(2)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sys.argv = ["cli", *sys.argv[2:]]
    sys.path.insert(0, str(ROOT))
    profiles: list[tuple[str, cProfile.Profile]] = []
    plain_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        p = cProfile.Profile()
        profiles.append((self.name, p))
        p.enable()
        try:
            plain_run(self)
        finally:
            p.disable()

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    main_profile = cProfile.Profile()
    profiles.append(("main", main_profile))

    def dump() -> None:
        main_profile.disable()
        (out / "threads.json").write_text(json.dumps(thread_cpu_seconds(), indent=1))
        for name, p in profiles:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
            try:
                p.dump_stats(str(out / f"{safe}.pstats"))
            except Exception as exc:  # a thread still running: skip it, say so
                print(f"profile of {name} not written: {exc!r}", file=sys.stderr)

    atexit.register(dump)
    main_profile.enable()
    from cli.main import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
