"""A model with symbolic dimensions: its VM library against the static library built for
each shape and against onnxruntime (docs/vm.md, "Symbolic dimensions").

    python -m pipeline.tools.dims_bench MODEL.onnx --dims batch=1:4 --dims seq=1:384 \\
        --at batch=4,seq=128 --at batch=1,seq=7 --at batch=1,seq=300 [--threads 1]

Builds the VM library once (bounds from --dims) and, per --at, the graph-executor
library with the symbols fixed to those values. Then, per shape, `rounds` rounds
alternate the three sides (dynamic, static, onnxruntime), each side in a fresh process
(pipeline.tools.bench_runner, as `doit bench` runs it) on the same seeded inputs
(integer inputs uniform in [0, --int-high), float ones standard normal). Prints per
shape each side's median of its rounds' medians and the ratios dynamic / static and
dynamic / onnxruntime (the median of the per-round ratios: the sides of a round ran
one after the other, so on a shared machine those are the figures that mean
something).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from pipeline.driver.build import build
from pipeline.frontend import from_onnx
from pipeline.tools.bench import run_side
from pipeline.transform import PassContext

TARGET = "llvm -mcpu=native"


def _pairs(text: str, what: str) -> dict[str, int]:
    """'a=1,b=2' -> {'a': 1, 'b': 2}; SystemExit naming `what` if malformed."""
    try:
        return {name: int(value) for name, value in (item.split("=", 1)
                                                      for item in text.split(","))}
    except ValueError:
        raise SystemExit(f"dims_bench: {what} {text!r}: expected NAME=VALUE[,NAME=VALUE]") from None


def _input_dims(model: onnx.ModelProto) -> dict[str, list]:
    """Each graph input's dims: ints and symbol names."""
    inits = {t.name for t in model.graph.initializer}
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in inits}


def _feeds(model: onnx.ModelProto, shapes: dict, int_high: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for i in model.graph.input:
        if i.name not in shapes:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        shape = shapes[i.name]
        feeds[i.name] = (rng.integers(0, int_high, shape).astype(dtype)
                         if np.issubdtype(dtype, np.integer)
                         else rng.standard_normal(shape).astype(dtype))
    return feeds


def build_libraries(model_path: str, bounds: dict, ats: list[dict], folder: Path,
                    target: str = TARGET) -> tuple[str, list[str]]:
    """The VM library for `bounds` and one static library per dict of symbol values
    in `ats`, written into `folder`; their paths."""
    model = onnx.load(model_path)
    graph, params = from_onnx(model, None, symbolic=True)
    with PassContext(opt_level=3):
        factory = build(graph, target=target, params=params, executor="vm",
                                 dims=bounds)
    dynamic = factory.export_library(str(folder / "dynamic.so"))
    statics = []
    for k, at in enumerate(ats):
        shapes = {name: tuple(at[d] if isinstance(d, str) else d for d in dims)
                  for name, dims in _input_dims(model).items()}
        graph, params = from_onnx(model, shapes)
        with PassContext(opt_level=3):
            factory = build(graph, target=target, params=params)
        statics.append(factory.export_library(str(folder / f"static{k}.so")))
    return dynamic, statics


def compare(model_path: str, dynamic: str, static: str, at: dict, folder: Path,
            threads: int, rounds: int, runs: int, int_high: int) -> dict:
    """Medians (ms) of the three sides at symbol values `at`, and the ratios."""
    model = onnx.load(model_path)
    shapes = {name: tuple(at[d] if isinstance(d, str) else d for d in dims)
              for name, dims in _input_dims(model).items()}
    inputs = str(folder / ("in_" + "_".join(f"{k}{v}" for k, v in at.items()) + ".npz"))
    np.savez(inputs, **_feeds(model, shapes, int_high))
    sides = {"dynamic": ("ours", dynamic), "static": ("ours", static),
             "onnxruntime": ("onnxruntime", model_path)}
    medians = {name: [] for name in sides}
    for _ in range(rounds):
        for name, (side, path) in sides.items():
            report = run_side(side, path, inputs, threads, runs, 10, Path(model_path).stem)
            medians[name].append(statistics.median(report["times_ms"]))
    row = {name: statistics.median(values) for name, values in medians.items()}
    for peer in ("static", "onnxruntime"):
        row[f"dynamic/{peer}"] = statistics.median(
            d / p for d, p in zip(medians["dynamic"], medians[peer], strict=True))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.dims_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="ONNX model whose inputs have symbolic dimensions")
    parser.add_argument("--dims", action="append", required=True,
                        help="NAME=LOW:HIGH, the bounds of a symbol (each symbol once)")
    parser.add_argument("--at", action="append", required=True,
                        help="NAME=VALUE[,NAME=VALUE]: a shape to time (repeatable)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--int-high", type=int, default=16,
                        help="integer inputs are drawn from [0, INT_HIGH) (token ids)")
    parser.add_argument("--target", default=TARGET)
    args = parser.parse_args(argv)
    bounds = {}
    for text in args.dims:
        name, _, span = text.partition("=")
        low, _, high = span.partition(":")
        if not (low.isdigit() and high.isdigit()):
            raise SystemExit(f"dims_bench: --dims {text!r}: expected NAME=LOW:HIGH")
        bounds[name] = (int(low), int(high))
    ats = [_pairs(text, "--at") for text in args.at]
    with tempfile.TemporaryDirectory(prefix="dims_bench") as tmp:
        folder = Path(tmp)
        dynamic, statics = build_libraries(args.model, bounds, ats, folder, args.target)
        print(f"{'shape':24s} {'dynamic ms':>10s} {'static ms':>10s} {'ort ms':>10s} "
              f"{'dyn/static':>10s} {'dyn/ort':>8s}   ({args.threads} thread(s), "
              f"{args.rounds} rounds x {args.runs} runs)")
        for at, static in zip(ats, statics, strict=True):
            row = compare(args.model, dynamic, static, at, folder, args.threads,
                          args.rounds, args.runs, args.int_high)
            label = ",".join(f"{k}={v}" for k, v in at.items())
            print(f"{label:24s} {row['dynamic']:10.3f} {row['static']:10.3f} "
                  f"{row['onnxruntime']:10.3f} {row['dynamic/static']:10.2f} "
                  f"{row['dynamic/onnxruntime']:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
