"""Live progress on stderr while windows run: a rich status line on a terminal (when rich is installed), plain
lines otherwise. stdout stays perf_analyzer's report, untouched."""

from __future__ import annotations

import sys
from typing import Any


def _describe(event: dict[str, Any]) -> str:
    if "status" in event:
        status = event["status"]
        c = status.client
        latency = status.stabilizing_latency_ns // 1000
        text = (f"{event['label']}: pass {event['pass']}/{event['max_trials']}  {c.infer_per_sec:.1f} infer/sec  "
                f"latency {latency} usec  requests {c.request_count}")
        if c.errors:
            text += f"  errors {c.errors}"
        return text
    records = event["records"]
    start, end = event["tick"]
    done = sum(1 for e in records.ends if start <= e <= end)
    seconds = (end - start) / 1e9
    rate = done / seconds if seconds else 0.0
    return (f"{event['label']}: {event['elapsed']:.1f}/{event['duration']}s  users {event['users']}  "
            f"{rate:.1f} req/s ({rate * 60:.0f}/min)")


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.live: Any = None
        self.running = False
        self.tty = enabled and sys.stderr.isatty()
        # Report lines and the live line share the screen only when stdout is that terminal too.
        self.shared = self.tty and sys.stdout.isatty()
        if self.tty:
            try:
                from rich.console import Console

                self.console = Console(stderr=True)
                # No stdout redirection: the report stays on stdout, wherever that goes.
                self.live = self.console.status("starting load workers")
                self.live._live._redirect_stdout = False
                self.live.start()
                self.running = True
            except (ImportError, AttributeError):
                self.live = None

    def __call__(self, event: dict[str, Any]) -> None:
        if not self.enabled:
            return
        text = _describe(event)
        if self.live is not None:
            self.live.update(text)
            if not self.running:
                self.live.start()
                self.running = True
        elif self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
            sys.stderr.flush()
        else:
            print(text, file=sys.stderr, flush=True)

    def pause(self) -> None:
        """Before stdout is written to the same terminal: the live line steps aside until the next update."""
        if not self.shared:
            return
        if self.live is not None:
            if self.running:
                self.live.stop()
                self.running = False
        elif self.tty:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.live is not None and self.running:
            self.live.stop()
            self.running = False
        elif self.tty and self.live is None:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
