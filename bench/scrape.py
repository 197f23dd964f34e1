"""A Prometheus stand-in for ``bench/load.py --scrape-interval``."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any


class Scraper:
    """A Prometheus stand-in: GET the metrics URL every ``interval`` seconds in a thread
    (for W1 with and without scrapes: the broker's hot path must not notice)."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.count, self.failures, self.seconds = 0, 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as resp:
                    resp.read()
                self.count += 1
                self.seconds += time.perf_counter() - started
            except OSError:
                self.failures += 1

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=15)
        mean = self.seconds / self.count if self.count else None
        return {"url": self.url, "count": self.count, "failures": self.failures,
                "mean_ms": round(mean * 1000, 2) if mean is not None else None}
