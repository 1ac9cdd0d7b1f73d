"""Timing a function the way TVM's `Module.time_evaluator` does, and its result.

    ftimer = time_evaluator(gmod.module.run, number=10, repeat=3, min_repeat_ms=50)
    print(ftimer())          # a BenchmarkResult: mean/median/max/min/std, in seconds

The function is called once to warm up (discarded), then `repeat` times
`number` calls are timed together; each repeat gives one result, the mean time
of one call in it. With `min_repeat_ms`, a repeat that took less time is done
again with a larger `number` (and that number is kept for the later repeats), so
each result averages enough calls to be above the timer's noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["BenchmarkResult", "time_evaluator"]

# TVM grows `number` by at least this factor per retry (min_repeat_ms not reached).
_GROWTH = 1.618


class BenchmarkResult:
    """Runtimes in seconds (TVM: tvm.runtime.module.BenchmarkResult).

    results: one per repeat, each the mean of `number` calls; mean, median, max,
    min and std (numpy's: the population standard deviation) summarise them.
    """

    def __init__(self, results: Sequence[float]):
        if len(results) == 0:
            raise ValueError("BenchmarkResult needs at least one result")
        self.results = [float(r) for r in results]
        self.mean = float(np.mean(self.results))
        self.median = float(np.median(self.results))
        self.max = float(np.max(self.results))
        self.min = float(np.min(self.results))
        self.std = float(np.std(self.results))

    def __repr__(self) -> str:
        return (f"BenchmarkResult(min={self.min}, mean={self.mean}, median={self.median}, "
                f"max={self.max}, std={self.std}, results={self.results})")

    def __str__(self) -> str:
        """A summary table in milliseconds, columns as TVM prints them."""
        cols = ("mean", "median", "max", "min", "std")
        head = " ".join(f"{c + ' (ms)':^12}" for c in cols)
        row = " ".join(f"{getattr(self, c) * 1e3:^12.4f}" for c in cols)
        return f"Execution time summary:\n{head}\n{row}"


def _check(name: str, value: Any, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ValueError(f"time_evaluator: {name} must be a number >= {low}, got {value!r}")


def time_evaluator(func: Callable[..., Any], number: int = 10, repeat: int = 1,
                   min_repeat_ms: float = 0, limit_zero_time_iterations: int = 100,
                   ) -> Callable[..., BenchmarkResult]:
    """A function that calls func(*args, **kwargs) as the module doc says and returns a
    BenchmarkResult of `repeat` results (TVM's defaults). ValueError for a
    number or repeat below 1 or a negative min_repeat_ms.
    limit_zero_time_iterations: how many retries a repeat may have that the
    clock measured as 0 ns before it is taken as it is (so it cannot hang)."""
    for name, value in (("number", number), ("repeat", repeat),
                        ("limit_zero_time_iterations", limit_zero_time_iterations)):
        if not isinstance(value, int):
            raise ValueError(f"time_evaluator: {name} must be an integer >= 1, got {value!r}")
        _check(name, value, 1)
    _check("min_repeat_ms", min_repeat_ms, 0)

    def evaluator(*args: Any, **kwargs: Any) -> BenchmarkResult:
        nonlocal number
        func(*args, **kwargs)  # warm-up: first-touch page faults, thread team start
        results = []
        for _ in range(repeat):
            elapsed_ms, zero_times = 0.0, 0
            while True:
                if elapsed_ms > 0:  # too short: enough calls for min_repeat_ms, and more
                    number = int(max(min_repeat_ms / (elapsed_ms / number) + 1,
                                     number * _GROWTH))
                start = time.perf_counter_ns()
                for _ in range(number):
                    func(*args, **kwargs)
                nanos = time.perf_counter_ns() - start
                zero_times += nanos == 0
                elapsed_ms = nanos / 1e6
                if elapsed_ms >= min_repeat_ms or zero_times >= limit_zero_time_iterations:
                    break
            results.append(elapsed_ms / 1e3 / number)
        return BenchmarkResult(results)

    return evaluator
