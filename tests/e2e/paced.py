"""Requests at a fixed rate, each on its own thread (a stuck one never holds the next back): the traffic the e2e
tests keep up through a front door while something breaks."""

from __future__ import annotations

import threading
import time


class Paced:
    """`one(n, started)` every 1/rate s from entering until leaving, which waits up to join_s for each."""

    join_s = 15.0

    def __init__(self, rate: float = 5.0):
        self.interval = 1 / rate
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.threads: list[threading.Thread] = []
        self.runner = threading.Thread(target=self._run, daemon=True)

    def one(self, n: int, started: float) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        n, t0 = 0, time.monotonic()
        while not self.stop.is_set():
            thread = threading.Thread(target=self.one, args=(n, time.monotonic()), daemon=True)
            thread.start()
            self.threads.append(thread)
            n += 1
            time.sleep(max(0.0, t0 + n * self.interval - time.monotonic()))

    def __enter__(self):
        self.t0 = time.monotonic()
        self.runner.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.runner.join()
        for thread in self.threads:
            thread.join(self.join_s)
        self.seconds = time.monotonic() - self.t0
