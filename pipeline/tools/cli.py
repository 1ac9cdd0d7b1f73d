"""The `pipeline` command: one ONNX file to one library, no config, no doit.

    pipeline compile MODEL.onnx -o OUT.so [--target T] [--opt-level N]
                     [--input NAME=1,3,224,224] [--cc CC] [--cache DIR]
    pipeline run LIB.so --input NAME=FILE.npy ... [--output-dir DIR] [--threads N]
    pipeline validate MODEL.onnx LIB.so [--reference onnxruntime|onnx] [--rtol R] [--atol A]
    pipeline bench MODEL.onnx LIB.so [--threads 1,2] [--rounds 3] [--runs 10] [--peers P,Q]
    pipeline info LIB.so [--json]

Every command runs the doit build's own functions: compile imports and lowers
with pipeline.driver, takes each kernel from the kernel cache doit uses
(pipeline.tasks.cache: the same folder by default, `--cache DIR` or
$PIPELINE_KERNEL_CACHE), compiling only what is missing, and links through
pipeline.link.export; validate and bench are pipeline.tools.validate and
pipeline.tools.bench. A mistake prints one line, `error: <file>: <problem>`, and
exits with status 1 (2 for a malformed command line, as argparse does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError

DEFAULT_TARGET = "llvm -mcpu=native"


class CommandError(PipelineError):
    """A mistake in what the command was given, worded for the user."""


def _dims(text: str, symbolic: bool = False) -> tuple[int | str, ...]:
    """"1,3,224,224" as a shape; with `symbolic` a name ("batch,16") keeps that
    dimension symbolic (the VM's, pipeline/ir/dims.py)."""
    dims = tuple(d if symbolic and d.isidentifier() else int(d) for d in text.split(","))
    if not dims or min((d for d in dims if isinstance(d, int)), default=1) < 1:
        raise ValueError
    return dims


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """["NAME=VALUE", ...] as a dict; CommandError naming the malformed item."""
    pairs = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise CommandError(f"--input {item!r}: expected {what}")
        pairs[name] = value
    return pairs


def input_shapes(items: Sequence[str], symbolic: bool = False) -> dict[str, tuple[int, ...]]:
    """--input NAME=1,3,224,224 options as {name: shape} (names too, for --executor vm)."""
    shapes = {}
    for name, text in _pairs(items, "NAME=d0,d1,... (positive integers)").items():
        try:
            shapes[name] = _dims(text, symbolic)
        except ValueError:
            raise CommandError(f"--input {name}={text}: the shape must be positive integers "
                               "separated by commas, e.g. 1,3,224,224") from None
    return shapes


# -- compile --------------------------------------------------------------------------------

def compile_model(model: str, output: str, target: str = DEFAULT_TARGET, opt_level: int = 3,
                  shapes: dict | None = None, cc: str | None = None,
                  cache: str | None = None, executor: str = "graph",
                  dims: Sequence[str] = ()) -> dict:
    """Compile the ONNX file `model` into the library `output` (.so, .tar or .o by its
    suffix); returns {"kernels", "compiled", "cache", "seconds"}. With executor "aot"
    `output` is the Model Library Format tar, lib<name>.a and <name>.h are written
    beside it (<name>: output's base name; docs/microcontrollers.md).

    The stages are the doit build's: from_onnx, lower_graph under a PassContext at
    `opt_level` (rendering each kernel once, unless a valid cache entry has its IR),
    each distinct kernel's object from the kernel cache `cache` (None: cache_dir's
    default), compiled into it from that IR when missing or damaged, and the export
    path of export_library with the target's `cc`; executor "vm" links a VM library
    (docs/vm.md), keeping symbolic dimensions with bounds `dims` ("seq=1:512"), and a
    model with If, Loop or Scan is lowered by lower_program, its kernels coming from
    the same cache.
    """
    from pipeline.driver.build import lower_graph, lower_program
    from pipeline.driver.factory import GraphExecutorFactory, unique_specs
    from pipeline.frontend import from_onnx
    from pipeline.ir.dims import parse_bounds, symbols_of
    from pipeline.ir.target import TargetError, parse_target
    from pipeline.link.export import LIBRARY_SUFFIXES, resolve_cc
    from pipeline.tasks.cache import entry_ir
    from pipeline.tasks.paths import cache_dir
    from pipeline.tools.compile_output import cached_objects, export_aot
    from pipeline.transform import PassContext
    from pipeline.vm.program import has_control_flow

    start = time.perf_counter()
    if executor == "aot" and not output.endswith(".tar"):
        raise CommandError(f"{output}: --executor aot writes a Model Library Format .tar")
    if not output.endswith(LIBRARY_SUFFIXES):
        raise CommandError(f"{output}: a library is a {', '.join(LIBRARY_SUFFIXES)} file")
    if not 0 <= opt_level <= 3:
        raise CommandError(f"--opt-level {opt_level}: must be 0, 1, 2 or 3")
    try:
        resolved = parse_target(target, cc)  # a c target's kernels are built by cc
    except TargetError as err:
        raise CommandError(f"--target {target!r}: {err}") from None
    if resolved.bare_metal and executor != "aot":
        raise CommandError(f"--target {target!r}: a bare-metal target loads no shared "
                           "library; compile with --executor aot")
    cc = resolve_cc(resolved, cc, "--cc")
    try:
        bounds = parse_bounds(dims, "--dims")
    except ValueError as err:
        raise CommandError(str(err)) from None
    graph, params = from_onnx(model, shapes or {}, control_flow=executor == "vm",
                              symbolic=executor == "vm")
    root = cache_dir(cache)
    if has_control_flow(graph) and executor != "vm":  # control flow is refused at import
        raise CommandError(f"{model}: output shapes that depend on values (NonZero, "
                           "NonMaxSuppression, Unique, runtime shape inputs) run only in the "
                           "VM: compile with --executor vm")

    def known(spec):
        return entry_ir(root, spec.hash, spec.symbol)

    with PassContext(opt_level=opt_level):
        if has_control_flow(graph):  # If, Loop, Scan: the VM's program of several graphs
            if bounds or symbols_of(*(graph.types[n].shape for n in graph.inputs)):
                raise CommandError(f"{model}: symbolic dimensions together with If/Loop/Scan "
                                   "or data-dependent shapes: not supported yet; use --input")
            lowered = lower_program(graph, params, resolved, opt_level, known)
            specs = lowered.specs
        else:
            lowered = lower_graph(graph, params, resolved, opt_level, known, bounds)
            specs = unique_specs(lowered.specs.values())
    objects, compiled = cached_objects(root, specs, lowered.ir)
    if executor == "aot":
        export_aot(lowered, objects, target, output, cc)
    elif has_control_flow(graph):
        GraphExecutorFactory(None, target, objects, executor, lowered.program,
                             specs).export_library(output, cc=cc)
    else:
        GraphExecutorFactory(lowered, target, objects, executor).export_library(output, cc=cc)
    return {"kernels": len(objects), "compiled": compiled, "cache": root,
            "seconds": round(time.perf_counter() - start, 2)}


def _compile(args: argparse.Namespace) -> None:
    done = compile_model(args.model, args.output, args.target, args.opt_level,
                         input_shapes(args.input, args.executor == "vm"), args.cc, args.cache,
                         args.executor, args.dims)
    print(f"{args.output}: {done['kernels']} kernels ({done['compiled']} compiled, "
          f"{done['kernels'] - done['compiled']} reused from {done['cache']}), "
          f"{done['seconds']:.1f} s")


# -- run, validate, bench -------------------------------------------------------------------

def _load(library: str):
    """(the loaded Module, a GraphModule of it) for a library of this machine; for
    another machine's library, a CommandError saying how to run it there."""
    from pipeline.runtime import GraphModule, load_module
    from pipeline.runtime.machine import ForeignLibraryError

    try:
        lib = load_module(library)
        return lib, GraphModule(lib["default"]())
    except FileNotFoundError:
        raise CommandError(f"{library}: no such file") from None
    except ForeignLibraryError:
        from pipeline.ir.target import parse_target
        from pipeline.tools.library_info import read_blob

        target = read_blob(library)[0].target
        arch = parse_target(target).arch
        raise CommandError(
            f"{library}: built for {arch} (target {target!r}), which "
            "this machine cannot run: use the target's pipeline-run under its run prefix, "
            f"e.g. qemu-{arch} -L /usr/{arch}-linux-gnu out/runtime/<target>/pipeline-run "
            f"{library} --input NAME=FILE.npy --output-dir DIR (doit build writes "
            "out/runtime/<target>/pipeline-run)") from None


def _open(library: str) -> tuple[dict, int, Callable[[dict], list]]:
    """(input shapes by name, the number of outputs, a function running the library
    on feeds and returning its outputs) of a graph or VM library of this machine; a
    VM library's symbolic dimensions at their bounds' highs (as doit validate runs)."""
    from pipeline.runtime.vm import VirtualMachine, is_vm_library

    if os.path.isfile(library) and is_vm_library(library):
        vm = VirtualMachine(library)
        exe = vm.executable.content
        main = exe.functions[0]
        return ({p.name: tuple(exe.dims[d][1] if isinstance(d, str) else d for d in p.shape)
                 for p in main.params}, len(main.results), lambda feeds: vm.run(**feeds))
    _, gm = _load(library)

    def run(feeds: dict) -> list:
        gm.run(**feeds)
        return [gm.get_output(i) for i in range(gm.get_num_outputs())]

    return gm.get_input_info()[0], gm.get_num_outputs(), run


def _read_npy(name: str, path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file (--input {name}=...)") from None
    except (ValueError, OSError, EOFError) as err:
        raise CommandError(f"{path}: not a .npy file ({str(err).splitlines()[0]})") from None


def _run_vm(args: argparse.Namespace, files: dict[str, str]) -> None:
    """`pipeline run` of a VM library (`executor: vm`): through the VirtualMachine."""
    from pipeline.runtime.vm import VirtualMachine, VMError

    vm = VirtualMachine(args.library)
    if args.threads is not None:
        vm.set_num_threads(args.threads)
    names = [p.name for p in vm.executable.content.functions[0].params]
    missing = [n for n in names if n not in files]
    if missing:
        raise CommandError(f"{args.library}: input {missing[0]!r} not given "
                           f"(--input {missing[0]}=FILE.npy)")
    try:
        outputs = vm.run(**{name: _read_npy(name, path) for name, path in files.items()})
    except VMError as err:
        raise CommandError(f"{args.library}: {err}") from None
    os.makedirs(args.output_dir, exist_ok=True)
    for i, value in enumerate(outputs):
        path = os.path.join(args.output_dir, f"output_{i}.npy")
        np.save(path, value)
        print(f"{path}  {list(value.shape)}  {value.dtype}")


def _run(args: argparse.Namespace) -> None:
    from pipeline.runtime.vm import is_vm_library
    from pipeline.tools.library_info import graph_tensors

    files = _pairs(args.input, "NAME=FILE.npy")
    if os.path.isfile(args.library) and is_vm_library(args.library):
        _run_vm(args, files)
        return
    lib, gm = _load(args.library)
    if args.threads is not None:
        gm.set_num_threads(args.threads)
    names = gm.get_input_names()
    unknown = [n for n in files if n not in names]
    if unknown:
        raise CommandError(f"{args.library}: no input named {unknown[0]!r}; inputs: {names}")
    given = {name: _read_npy(name, path) for name, path in files.items()}
    missing = [n for n in names if n not in given]
    if missing:
        raise CommandError(f"{args.library}: input {missing[0]!r} not given "
                           f"(--input {missing[0]}=FILE.npy)")
    for name, value in given.items():
        try:
            gm.set_input(name, value)
        except (KeyError, ValueError) as err:
            raise CommandError(f"{args.library}: {err.args[0]} (from {files[name]})") from None
    gm.run()
    _, outputs = graph_tensors(lib.graph_json, set(lib.params))
    os.makedirs(args.output_dir, exist_ok=True)
    for i, row in enumerate(outputs):
        path = os.path.join(args.output_dir, f"output_{i}.npy")
        value = gm.get_output(i)
        np.save(path, value)
        print(f"{path}  {list(value.shape)}  {value.dtype}  (node {row['name']})")


def _reference(name: str | None) -> str:
    if name is not None:
        return name
    import importlib.util

    return "onnxruntime" if importlib.util.find_spec("onnxruntime") else "onnx"


def _validate(args: argparse.Namespace) -> None:
    from pipeline.frontend.onnx.importer import load_model
    from pipeline.frontend.onnx.shapes import with_input_shapes
    from pipeline.tools.validate import compare, random_inputs, reference_outputs

    shapes, n_outputs, run = _open(args.library)
    # The library was built for its input shapes: the reference runs at them too.
    model = with_input_shapes(load_model(args.model), shapes)
    feeds = random_inputs(model, shapes, args.seed)
    names = [o.name for o in model.graph.output]
    if len(names) != n_outputs:
        raise CommandError(f"{args.library}: has {n_outputs} outputs, "
                           f"{args.model} has {len(names)}: not built from this model?")
    try:
        ours = run(feeds)
    except (KeyError, ValueError, PipelineError) as err:
        raise CommandError(f"{args.library}: {err.args[0]} (not built from "
                           f"{args.model}?)") from None
    reference = _reference(args.reference)
    rows = compare(names, ours, reference_outputs(model, feeds, reference), args.rtol,
                   args.atol)
    for r in rows:
        detail = r.get("problem") or (f"max abs error {r['max_abs_err']:.3g}, "
                                      f"max rel error {r['max_rel_err']:.3g}")
        print(f"{r['name']}: {detail}: {'ok' if r['passed'] else 'MISMATCH'}")
    bad = [r["name"] for r in rows if not r["passed"]]
    if bad:
        raise CommandError(f"{args.library}: output {bad[0]!r} differs from {reference} "
                           f"beyond rtol {args.rtol}, atol {args.atol}")
    print(f"{args.library}: matches {reference} on seed {args.seed} "
          f"(rtol {args.rtol}, atol {args.atol})")


def _bench(args: argparse.Namespace) -> None:
    from pipeline.runtime.vm import is_vm_library
    from pipeline.tools.bench import bench_library

    if os.path.isfile(args.library) and is_vm_library(args.library):
        shapes, target = _open(args.library)[0], "vm"  # a VM library records no target
    else:
        lib, gm = _load(args.library)
        shapes, target = gm.get_input_info()[0], lib.target
        del gm  # the timed runs load the library in processes of their own
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        report = args.report or os.path.join(tmp, "bench.json")
        bench_library(args.library, args.model, {k: list(v) for k, v in shapes.items()},
                      Path(args.model).stem, target, report, args.peak_file, args.threads,
                      args.rounds,
                      args.runs, args.warmup, "1" if args.profile else "0",
                      peers=args.peers)


def _info(args: argparse.Namespace) -> None:
    from pipeline.tools.library_info import describe_library, format_info

    info = describe_library(args.library)
    print(json.dumps(info, indent=1) if args.json else format_info(info))


# -- the command line -----------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="pipeline", description="Compile an ONNX model into a self-contained CPU "
        "library, run, check, time or describe one.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("compile", help="ONNX file -> .so (or .tar, .o)",
                       description="Compile MODEL.onnx into a library (.so, .tar or .o by "
                       "the suffix of -o), through the kernel cache doit uses.")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, metavar="OUT.so")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target string (default {DEFAULT_TARGET!r}; e.g. "
                   "'llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76')")
    p.add_argument("--opt-level", type=int, default=3, help="0..3 (default 3)")
    p.add_argument("--executor", choices=("graph", "vm", "aot"), default="graph",
                   help="graph (a library with the graph executor, default), vm (a "
                   "library whose .ro the VM runs: control flow) or aot (a Model "
                   "Library Format .tar, lib<name>.a and <name>.h)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=1,3,224,224",
                   help="fix an input's shape (any batch; a symbolic dim needs one, or "
                   "--executor vm: a name keeps it symbolic)")
    p.add_argument("--dims", action="append", default=[], metavar="NAME=LOW:HIGH",
                   help="bounds of a symbolic dimension (--executor vm)")
    p.add_argument("--cc", help="the target's C compiler, which links (default $CC or cc; "
                   "required for another machine's target)")
    p.add_argument("--cache", metavar="DIR", help="the kernel cache (default "
                   "$PIPELINE_KERNEL_CACHE, else out/kernels, as doit)")
    p.set_defaults(handler=_compile)

    p = sub.add_parser("run", help="run a library on .npy inputs",
                       description="Run LIB on this machine; writes DIR/output_<i>.npy.")
    p.add_argument("library", metavar="LIB.so")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--output-dir", default=".", metavar="DIR", help="default: .")
    p.add_argument("--threads", type=int, help="threads the kernels use (default: all)")
    p.set_defaults(handler=_run)

    # validate and bench take the same two positionals
    model_and_library = argparse.ArgumentParser(add_help=False)
    model_and_library.add_argument("model", metavar="MODEL.onnx")
    model_and_library.add_argument("library", metavar="LIB.so")
    p = sub.add_parser("validate", help="compare a library with onnxruntime",
                       parents=[model_and_library],
                       description="Run LIB and MODEL.onnx's reference on the same seeded "
                       "random inputs (at LIB's input shapes) and compare every output.")
    p.add_argument("--reference", choices=("onnxruntime", "onnx"),
                   help="default: onnxruntime if installed, else onnx.reference")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_validate)

    p = sub.add_parser("bench", help="time a library against onnxruntime and openvino",
                       parents=[model_and_library],
                       description="Time LIB against onnxruntime (and OpenVINO when "
                       "installed) on MODEL.onnx, each side in its own process, rounds "
                       "alternating (as doit bench).")
    p.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    p.add_argument("--rounds", default="3")
    p.add_argument("--runs", default="10")
    p.add_argument("--warmup", default="10")
    p.add_argument("--profile", action="store_true", help="also list the slowest nodes")
    p.add_argument("--report", metavar="FILE.json", help="also write the report there")
    p.add_argument("--peers", metavar="onnxruntime,openvino",
                   help="the runtimes to time against (default: onnxruntime and every "
                   "other one installed)")
    p.add_argument("--peak-file", default=os.path.join("out", "bench-peak.json"),
                   help="where the best FMA peak of this CPU is kept (as doit bench)")
    p.set_defaults(handler=_bench)

    p = sub.add_parser("info", help="what a library holds",
                       description="Target, format, inputs/outputs, params, kernels and "
                       "build id of a library (.so, .tar or .o; any machine's).")
    p.add_argument("library", metavar="LIB.so")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(handler=_info)
    return top


def _first_file(args: argparse.Namespace) -> str:
    return getattr(args, "model", None) or getattr(args, "library", "")


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        args.handler(args)
    except (PipelineError, OSError, ValueError, KeyError) as err:
        text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        text = text.splitlines()[0] if text else type(err).__name__
        where = _first_file(args)
        # CommandError names its file; other errors name the model or library
        # (the frontend, the loader) or get it put in front.
        if not isinstance(err, CommandError) and not text.startswith(
                (where, "--", os.path.abspath(where))):
            text = f"{where}: {text}"
        print(f"error: {text}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
