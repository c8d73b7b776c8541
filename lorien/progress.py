"""Progress for long commands: a bar on a terminal, one line per step in a log.

``Progress(total, "ingest", unit="file")`` draws a tqdm bar when its stream (stderr by default)
is a terminal; otherwise each ``step`` writes one line (``ingest: 3/12 files - a.log: 1204
records``; at most one per ``line_interval_s``), which is what a CI log or ``2> run.log``
wants. Disabled, it says nothing.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO


class Progress:
    """Steps of one long piece of work, shown on ``stream`` (default stderr)."""

    def __init__(self, total: int | None, label: str, unit: str = "step", enabled: bool = True,
                 stream: TextIO | None = None, line_interval_s: float = 0.0):
        self.total, self.label, self.unit, self.enabled = total, label, unit, enabled
        self.stream = stream or sys.stderr
        self.line_interval_s = line_interval_s
        self.done = 0
        self._last_line = -math.inf
        self._bar = None
        if enabled and _is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit, file=self.stream, dynamic_ncols=True,
                             leave=True)

    @property
    def is_bar(self) -> bool:
        """Whether a bar is drawn (a terminal) rather than lines written."""
        return self._bar is not None

    def step(self, note: str = "", count: int = 1) -> None:
        """``count`` more steps done; ``note`` says what the last one was."""
        self.done += count
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(count)
            if note:
                self._bar.set_postfix_str(note, refresh=True)
            return
        now = time.monotonic()
        if now - self._last_line < self.line_interval_s and self.done != self.total:
            return
        self._last_line = now
        of_total = f"/{self.total}" if self.total is not None else ""
        print(f"{self.label}: {self.done}{of_total} {self.unit}{'s' if self.total != 1 else ''}"
              + (f" - {note}" if note else ""), file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """Show ``text`` without counting a step (the bar's postfix, or a line)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)
        else:
            print(f"{self.label}: {text}", file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """A line of its own that does not break the bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
