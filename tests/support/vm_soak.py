"""One VM library run many times in one process of its own (so the RSS it reports is
the VM's, not a long test session's):

    python -m tests.support.vm_soak LIB INPUTS.npz EXPECTED.npz RUNS WARMUP

INPUTS.npz holds the inputs `x` fed in turn (x0, x1, ...), EXPECTED.npz the outputs
of each (y<k>_<j>: output j of input k). After WARMUP runs the RSS is read, then the
runs go on to RUNS in all. Prints one JSON line: the runs made, the first errors (a
wrong output or an exception) and the RSS after warm-up and at the end."""

from __future__ import annotations

import json
import sys

import numpy as np

from pipeline.runtime.vm import VirtualMachine
from tests.support.soak import rss_bytes


def vm_soak(lib_path: str, inputs: list, expected: list[list], runs: int, warmup: int
            ) -> dict:
    """Run the library's VM `runs` times over `inputs` in turn; see the module doc."""
    vm = VirtualMachine(lib_path)
    errors, rss_warm, done = [], 0, 0
    for k in range(runs):
        if k == warmup:
            rss_warm = rss_bytes()
        which = k % len(inputs)
        try:
            got = vm.run(inputs[which])
        except Exception as err:  # noqa: BLE001 - reported to the caller
            errors.append(f"run {k}: {err!r}")
            break
        if not all(np.array_equal(g, e) for g, e in zip(got, expected[which], strict=True)):
            errors.append(f"run {k}: input {which} gave other outputs than before")
            break
        done += 1
    return {"runs": done, "errors": errors[:3], "rss_warm": rss_warm, "rss_end": rss_bytes()}


if __name__ == "__main__":
    lib, inputs, expected, runs, warmup = sys.argv[1:6]
    with np.load(inputs) as xs, np.load(expected) as ys:
        xs_list = [xs[f"x{k}"] for k in range(len(xs.files))]
        ys_list = [[ys[f"y{k}_{j}"] for j in range(sum(f.startswith(f"y{k}_")
                                                        for f in ys.files))]
                   for k in range(len(xs_list))]
    print(json.dumps(vm_soak(lib, xs_list, ys_list, int(runs), int(warmup))))
