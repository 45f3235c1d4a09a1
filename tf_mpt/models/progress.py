"""A progress bar on stderr for `tf-mpt` commands that run a model many times.

On a terminal the bar redraws in place; otherwise (a log file, CI) it prints a line at the
start, at every quarter and at the end, so logs stay short.
"""

import sys
import time


class Progress:
    """`bar = Progress(total, "validating")`, `bar.advance()` per step, `bar.close()`."""

    WIDTH = 30

    def __init__(self, total, label, stream=None):
        self.total = max(int(total), 1)
        self.label = label
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = hasattr(self._stream, "isatty") and self._stream.isatty()
        self._start = time.perf_counter()
        self._last_quarter = -1
        self._draw()

    def close(self):
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()

    def advance(self, steps=1, total=None):
        """One more step done; `total` replaces the total when it becomes known."""
        if total is not None:
            self.total = max(int(total), 1)
        self.done = min(self.done + steps, self.total)
        self._draw()

    def _draw(self):
        filled = self.WIDTH * self.done // self.total
        seconds = time.perf_counter() - self._start
        text = (f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                f"{self.done}/{self.total} {seconds:.1f}s")
        if self._tty:
            self._stream.write("\r" + text)
        else:
            quarter = 4 * self.done // self.total
            if quarter == self._last_quarter:
                return
            self._last_quarter = quarter
            self._stream.write(text + "\n")
        self._stream.flush()
