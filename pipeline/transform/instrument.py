"""Pass instruments (TVM: tvm.instrument.PassInstrument): hooks around the passes
of a PassContext, `PassContext(instruments=[...])`.

An instrument defines any of enter_pass_ctx(), exit_pass_ctx() (also called when
a pass raised), should_run(graph, info) (a False from any instrument skips the
pass), run_before_pass(graph, info) and run_after_pass(graph, info) (only for a
pass that ran). Instruments are called in the order they were given.
PassTimingInstrument times each pass: the optimize task puts its times in the
build report (out/build-report.json, "passes").
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PassInfo:
    """What an instrument is told about the pass (TVM: tvm.transform.PassInfo)."""
    name: str
    opt_level: int  # the PassContext opt_level from which it runs by default


class PassInstrument:
    """No-op hooks; subclass and override the ones you need."""

    def enter_pass_ctx(self) -> None:
        """Called when the PassContext holding this instrument is entered."""

    def exit_pass_ctx(self) -> None:
        """Called when it is left, normally or by an exception."""

    def should_run(self, graph, info: PassInfo) -> bool:
        """Whether the pass runs (every instrument must agree)."""
        return True

    def run_before_pass(self, graph, info: PassInfo) -> None:
        """Called with the graph a pass is about to transform."""

    def run_after_pass(self, graph, info: PassInfo) -> None:
        """Called with the graph the pass returned."""


class PassTimingInstrument(PassInstrument):
    """Wall time of each pass run in its context (TVM: PassTimingInstrument).

    `timings`: [{"pass": name, "seconds": s}, ...] in the order passes ran;
    entering a context again starts a new list.
    """

    def __init__(self):
        self.timings: list[dict] = []
        self._start = 0.0

    def enter_pass_ctx(self) -> None:
        self.timings = []

    def run_before_pass(self, graph, info: PassInfo) -> None:
        self._start = time.perf_counter()

    def run_after_pass(self, graph, info: PassInfo) -> None:
        self.timings.append({"pass": info.name,
                             "seconds": round(time.perf_counter() - self._start, 6)})

    def render(self) -> str:
        """One line per pass, then the total."""
        total = sum(t["seconds"] for t in self.timings)
        lines = [f"{t['pass']:<18} {t['seconds'] * 1e3:9.3f} ms" for t in self.timings]
        return "\n".join([*lines, f"{'total':<18} {total * 1e3:9.3f} ms"])
