"""Concurrency bookkeeping shared by the slow peers: the number of tool calls
a server process is working on, and the most it ever worked on at once,
written to `<stats dir>/<pid>` (one file per process, so restarts keep
their figures) after every change."""

import os
import threading


class Concurrency:
    def __init__(self, stats_dir):
        self._path = os.path.join(stats_dir, str(os.getpid()))
        self._lock = threading.Lock()
        self.now = 0
        self.max = 0
        self._write()

    def enter(self):
        with self._lock:
            self.now += 1
            self.max = max(self.max, self.now)
            self._write()

    def leave(self):
        with self._lock:
            self.now -= 1
            self._write()

    def _write(self):
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{self.max} {self.now}\n")
        os.replace(tmp, self._path)
