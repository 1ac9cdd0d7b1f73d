"""Rebuild benchmark: what each kind of change costs, through real doit runs.

    python -m pipeline.tools.rebuild_bench [--model resnet50] [--repeat 3]

In a temporary folder it writes the model's ONNX file and a one-entry matrix,
then times `doit build` (each a fresh process, as a user runs it):
cold serial and cold `-n 2` (each in a clean folder, alternating, medians),
no-op, after a weight change, after a pass option change that affects one
kernel family (FuseOps.max_depth: 2 splits the conv+add+relu kernels only), and
after adding a second target (llvm -mcpu=haswell). Kernel counts come from the build report
(out/build-report.json). Prints a Markdown table; times are wall-clock
seconds of the whole doit process, medians where repeated; then the weight
change's tasks with their own times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.tasks.paths import REPORT

REPO = Path(__file__).resolve().parents[2]  # the checkout: pipeline/tools/ is two below
TARGET = '{target: "llvm -mcpu=native", opt_level: 3}'


def write_matrix(folder: Path, model: str, targets: str) -> None:
    (folder / "matrix.yaml").write_text(
        f"models:\n  {model}: {{path: {model}.onnx}}\ntargets:\n{targets}")


def run_doit(folder: Path, *args: str) -> tuple[float, dict]:
    """Time one `doit build` in `folder`; returns (seconds, the build report)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PIPELINE_KERNEL_CACHE", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"),
                           "-d", str(folder), *args, "build", "config=matrix.yaml"],
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"doit failed in {folder}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds, json.loads((folder / REPORT).read_text())


def kernels(report: dict) -> tuple[int, int]:
    """(compiled, reused) summed over the entries the build looked at."""
    entries = report["entries"].values()
    compiled = {i["task"] for i in report["executed"]
                if i["task"].startswith("kernel:") and i.get("status") == "ok"}
    return len(compiled), sum(e["kernels"] for e in entries) - len(compiled)


def perturb_weights(path: Path) -> None:
    """Scale the largest initializer by 1.01: same layers, new weight values."""
    model = onnx.load(str(path))
    big = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    big.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(big) * np.float32(1.01),
                                         big.name))
    onnx.save(model, str(path))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a models/ generator")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each cold build and of the no-op build (medians)")
    args = parser.parse_args(argv)
    from models import generate

    rows = []
    with tempfile.TemporaryDirectory(prefix="rebuild-bench-") as tmp:
        model = Path(tmp, f"{args.model}.onnx")
        generate(args.model, str(model))

        def fresh(name: str) -> Path:
            """A folder holding the model and a one-entry matrix, nothing built."""
            folder = Path(tmp, name)
            folder.mkdir()
            shutil.copy(model, folder / model.name)
            write_matrix(folder, args.model, f"  llvm: {TARGET}\n")
            return folder

        def step(name: str, folder: Path, *doit_args: str) -> float:
            seconds, report = run_doit(folder, *doit_args)
            rows.append((name, seconds, *kernels(report)))
            print(f"  {name}: {seconds:.2f} s", file=sys.stderr)
            return seconds

        # Cold builds (own folder, own kernel cache) alternate serial and -n 2,
        # so drift in the machine's load hits both alike.
        cold_args = {"serial": (), "-n 2": ("-n", "2")}
        cold_runs: dict[str, list] = {kind: [] for kind in cold_args}
        for i in range(args.repeat):
            for kind, doit_args in cold_args.items():
                folder = fresh(f"cold-{i}-{'parallel' if doit_args else 'serial'}")
                cold_runs[kind].append(run_doit(folder, *doit_args))
        medians = {kind: statistics.median(s for s, _ in runs) for kind, runs in cold_runs.items()}
        for kind, runs in cold_runs.items():
            rows.append((f"cold build, {kind} (median of {args.repeat})", medians[kind],
                         *kernels(runs[0][1])))
        cold, cold_n2 = medians["serial"], medians["-n 2"]
        serial = Path(tmp, "cold-0-serial")  # the later steps go on from this build
        noop = [run_doit(serial) for _ in range(args.repeat)]
        rows.append((f"no-op rebuild (median of {args.repeat})",
                     statistics.median(s for s, _ in noop), *kernels(noop[-1][1])))
        perturb_weights(serial / f"{args.model}.onnx")
        weights = step("(a) weight change", serial)
        weight_tasks = json.loads((serial / REPORT).read_text())
        write_matrix(serial, args.model, '  llvm: {target: "llvm -mcpu=native", '
                     "opt_level: 3, config: {FuseOps.max_depth: 2}}\n")
        step("(b) pass option FuseOps.max_depth 256 -> 2", serial)
        write_matrix(serial, args.model, '  llvm: {target: "llvm -mcpu=native", '
                     "opt_level: 3, config: {FuseOps.max_depth: 2}}\n"
                     '  haswell: {target: "llvm -mcpu=haswell", opt_level: 3}\n')
        step("(c) second target added (llvm -mcpu=haswell)", serial)

    print(f"\nRebuild benchmark: {args.model}, `python -m pipeline.tools.rebuild_bench "
          f"--model {args.model}`, {os.cpu_count()} cores\n")
    print("| step | wall s | kernels compiled | kernels reused |")
    print("|---|---:|---:|---:|")
    for name, seconds, compiled, reused in rows:
        print(f"| {name} | {seconds:.2f} | {compiled} | {reused} |")
    print(f"\nspeed-up of -n 2 on the cold build: {cold / cold_n2:.2f}x; "
          f"weight change / cold build: {weights / cold:.1%}")
    print(f"\nWhere the weight change's {weights:.2f} s went (the rest is doit's start, "
          "loading the compiler and hashing the model file):\n")
    print("| task | s |\n|---|---:|")
    for item in weight_tasks["executed"]:
        print(f"| {item['task']} | {item.get('seconds', 0):.2f} |")


if __name__ == "__main__":
    main()
