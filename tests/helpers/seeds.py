"""The seed of a randomised test (the hostile-frame fuzzer, the schemathesis run): a
fixed one in the suite, as Hypothesis' ``derandomize`` does for CI, so a run fails the
same way every time; ``AMQLITE_FUZZ_SEED=random`` draws a fresh one for a deliberate
search, ``AMQLITE_FUZZ_SEED=N`` reproduces the run that printed N."""

from __future__ import annotations

import os
import secrets


def fuzz_seed(ci_seed: int) -> int:
    chosen = os.environ.get("AMQLITE_FUZZ_SEED", "")
    return secrets.randbelow(2**31) if chosen == "random" else int(chosen or ci_seed)
