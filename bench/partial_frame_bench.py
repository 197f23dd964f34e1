"""Micro-benchmark of a big frame arriving in pieces: one FrameParser fed a 10 MiB SEND in
64 KiB chunks (as a slow client's socket reads give it), with and without
content-length; prints one JSON object.

Why (issue 23, item 1): a partial frame is held bytes, counted against max_memory, and
what the parser does while it grows is transient memory the budget does not see. Each
figure comes from a fresh interpreter (so one case's heap does not shape the next's);
each read is a new bytes object, as a transport's are, freed unless the parser keeps it:

* ``first_ms``: the first frame fed in the interpreter; ``warm_ms``: the best of
  ROUNDS more. Both are mostly the kernel's first touch of the pages the reads and
  the body take (about 20 MiB: ~8 ms here), and move with the heap's state and the
  machine's load far more than with the parser's copies: read them side by side
  only, and several times;
* ``tracemalloc``: Python's own peak allocation while one frame is fed, over the
  frame's size (1.0 = nothing but the frame's bytes);
* ``rss``: the process's peak RSS growth (VmHWM) while one frame is fed, over its
  size, with glibc's heap warm: a 32 MiB block allocated and freed first, as a broker
  that has held big frames has done, which raises glibc's mmap threshold so that big
  buffers live in the heap, where growing one may copy it.

Run: ``.venv/bin/python bench/partial_frame_bench.py`` (PYTHONPATH selects the tree).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

#: The tree measured: PYTHONPATH's first entry, else this checkout.
ROOT = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or
            Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

MIB = 1024 * 1024
#: The broker's default max_frame_size (amqlite.codec.DEFAULT_MAX_FRAME_SIZE) less a
#: head's room: the largest body a default broker takes.
BODY = 10 * MIB - 4096
#: What one socket read of a slow sender gives the parser.
CHUNK = 64 * 1024
ROUNDS = 5


def frame(content_length: bool) -> bytes:
    head = "SEND\ndestination:/queue/big\nreceipt:r1\n"
    if content_length:
        head += f"content-length:{BODY}\n"
    return (head + "\n").encode() + b"y" * BODY + b"\x00"


def feed_once(wire: bytes) -> float:
    from amqlite.codec import Frame, FrameParser

    parser = FrameParser()
    start = time.perf_counter()
    out = []
    for i in range(0, len(wire), CHUNK):
        out.extend(parser.feed(wire[i:i + CHUNK]))  # a new bytes object per read
    elapsed = time.perf_counter() - start
    [item] = out
    assert isinstance(item, Frame) and len(item.body) == BODY
    return elapsed


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def one_case(kind: str, content_length: bool) -> float:
    """One measurement in this (fresh) interpreter."""
    wire = frame(content_length)
    if kind == "first_ms":
        return feed_once(wire) * 1000
    if kind == "warm_ms":
        feed_once(wire)  # warm-up: imports, first allocations
        return min(feed_once(wire) for _ in range(ROUNDS)) * 1000
    if kind == "tracemalloc":
        from amqlite.codec import FrameParser
        parser = FrameParser()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for i in range(0, len(wire), CHUNK):
            parser.feed(wire[i:i + CHUNK])
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        return peak / BODY
    # rss: a warm heap, then the peak growth while one frame is fed
    block = bytearray(32 * MIB)  # touched: resident, then freed
    del block
    from amqlite.codec import FrameParser
    parser = FrameParser()
    before = vm("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    out = []
    for i in range(0, len(wire), CHUNK):
        out.extend(parser.feed(wire[i:i + CHUNK]))
    return (vm("VmHWM") - before) / BODY


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", nargs=2, metavar=("NAME", "CONTENT_LENGTH"),
                    help="one case in this interpreter (what the whole run spawns)")
    case = ap.parse_args().case
    if case is not None:
        print(one_case(case[0], case[1] == "1"))
        return
    result: dict[str, object] = {"body_mib": round(BODY / MIB, 3), "chunk_kib": CHUNK // 1024}
    for content_length in (False, True):
        name = "content_length" if content_length else "nul"
        for kind in ("first_ms", "warm_ms", "tracemalloc", "rss"):
            out = subprocess.run([sys.executable, __file__, "--case", kind,
                                  "1" if content_length else "0"],
                                 check=True, capture_output=True, text=True).stdout
            result[f"{name}_{kind}"] = round(float(out), 3)
    from amqlite import codec
    result["codec"] = codec.__file__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
