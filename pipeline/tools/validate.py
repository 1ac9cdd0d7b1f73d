"""Validation: run a built library and compare it with an independent reference.

The reference is onnx.reference.ReferenceEvaluator (or onnxruntime when the
config asks for it). onnx 1.23's evaluator gets inference-mode
BatchNormalization wrong for opsets 9-14 (it mixes in the batch statistics;
onnx/onnx PR #8442), so we hand it a BatchNormalization that follows the spec:
y = scale * (x - mean) / sqrt(var + epsilon) + bias. It also joins a Loop's scan
outputs with np.vstack, which gives [3, 4] for three rows of [1, 4] where the spec
stacks them into [3, 1, 4], and runs no iteration without a condition input: our
Loop reshapes them to (iterations, *row shape) and takes an absent condition as true.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_loop import Loop as _OnnxLoop

from pipeline.errors import PipelineError
from pipeline.files import atomic_write
from pipeline.frontend.onnx.importer import load_model
from pipeline.frontend.onnx.shapes import with_input_shapes
from pipeline.link.integrity import verify_code_digest
from pipeline.runtime import GraphModule, load_module
from pipeline.runtime.vm import VirtualMachine, is_vm_library
from pipeline.tools.on_target import require_run, run_aot_program, run_on_target


class ValidationError(PipelineError):
    """Our outputs differ from the reference beyond the tolerances."""


class BatchNormalization(OpRun):
    """Inference-mode BatchNormalization, per the ONNX operator spec."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None,
             training_mode=None, spatial=None, is_test=None, consumed_inputs=None):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        eps = 1e-5 if epsilon is None else epsilon
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
        return ((y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype),)


class Loop(_OnnxLoop):
    """onnx's Loop with each scan output stacked as the spec says: (iterations, *the
    shape of a row), from the rows its body gave (N loop-carried values come first);
    and an absent condition input taken as true, as the spec says (onnx runs no
    iteration then)."""

    op_domain = ""

    def __init__(self, onnx_node, run_params):
        super().__init__(onnx_node, run_params)
        # onnx binds the body's runner to the instance: wrapped to see each row.
        run_body = self._run_body

        def recording(*args, **kwargs):
            outputs = run_body(*args, **kwargs)
            self._row_shapes.append([np.shape(o) for o in outputs[len(outputs) - self.K:]])
            return outputs

        self._run_body = recording

    def _run(self, trip_count, cond, *args, **kwargs):
        self._row_shapes: list[list[tuple]] = []
        # No condition input means "run the trip count" (onnx's runs no iteration).
        cond = np.array(True) if cond is None else cond
        results = list(super()._run(trip_count, cond, *args, **kwargs))
        if self._row_shapes and self.K:
            n = len(self._row_shapes)
            for k, shape in enumerate(self._row_shapes[0]):
                results[self.N + k] = np.asarray(results[self.N + k]).reshape(n, *shape)
        return tuple(results)


def random_inputs(model: onnx.ModelProto, shapes: dict[str, tuple], seed: int) -> dict:
    """Seeded inputs for every real graph input: standard-normal floats; integers in
    [0, n) where n is the smallest extent they index (see index_bound); bools 0/1."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = shapes.get(vi.name) or tuple(d.dim_value for d in
                                             vi.type.tensor_type.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[vi.name] = rng.integers(0, index_bound(model, vi.name), shape).astype(dtype)
    return feeds


def index_bound(model: onnx.ModelProto, name: str, default: int = 10) -> int:
    """How many distinct values integer input `name` may take and stay valid: the
    smallest extent along the gathered axis of any Gather whose indices it is and
    whose data is an initializer (token ids into an embedding table, say), else
    `default`."""
    dims = {i.name: list(i.dims) for i in model.graph.initializer}
    bounds = []
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[1] == name and node.input[0] in dims:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            bounds.append(dims[node.input[0]][axis])
    return min(bounds, default=default)


def reference_outputs(model: onnx.ModelProto, feeds: dict, reference: str) -> list:
    """The reference's outputs for `feeds`, in graph-output order."""
    if reference == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            raise PipelineError("validate.reference is 'onnxruntime' but onnxruntime is "
                                "not installed (pip install onnxruntime)") from None
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    return ReferenceEvaluator(model, new_ops=[BatchNormalization, Loop]).run(None, feeds)


def output_scales(model: onnx.ModelProto) -> dict[str, float]:
    """The quantization step of each graph output computed by a DequantizeLinear with a
    per-tensor constant scale: {output name: scale}."""
    consts = {i.name: i for i in model.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in model.graph.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    outputs = {o.name for o in model.graph.output}
    scales = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in outputs \
                and node.input[1] in consts:
            scale = onnx.numpy_helper.to_array(consts[node.input[1]])
            if scale.size == 1:
                scales[node.output[0]] = float(scale.reshape(()))
    return scales


def output_atols(model: onnx.ModelProto, options: dict) -> dict[str, float]:
    """atol per graph output: the options' atol, plus quant_steps times its scale for
    a dequantized output when the options set quant_steps (the atol then absorbs the
    float rounding of two dequantized values a step apart)."""
    steps = options.get("quant_steps")
    scales = output_scales(model) if steps is not None else {}
    return {o.name: options["atol"] + (steps * scales[o.name] if o.name in scales else 0.0)
            for o in model.graph.output}


def _run_ours(lib_path: str, feeds: dict, n_outputs: int, target: str,
              on_target: dict | None) -> tuple[list, float, dict]:
    """The library's outputs for `feeds`, the seconds of its run and where it ran
    (validate_library's on_target says how)."""
    if on_target is None:
        ours, run_s = _run_here(lib_path, feeds, is_vm_library(lib_path))
        return ours, run_s, {"ran_on": "host"}
    if "metadata" in on_target:  # executor aot: the model's own program
        prefix = [] if on_target["run"] is None and on_target.get("host") else \
            require_run(on_target["run"], on_target["config"], target, on_target["arch"])
        metadata = json.loads(Path(on_target["metadata"]).read_text())
        ours, run_s = run_aot_program(prefix, lib_path, metadata, feeds)
        return ours, run_s, {"ran_on": "target" if prefix else "host", "run": on_target["run"],
                             "executor": "aot"}
    prefix = require_run(on_target["run"], on_target["config"], target, on_target["arch"])
    # The code digest is checked here, on the file (any ELF64); the blob's sha256 by
    # the executor on the target (pl_create).
    verify_code_digest(lib_path, lib_path)
    # One timed run after the checked one: the emulated time of a run alone.
    ours, ms, run_s = run_on_target(prefix, on_target["pipeline_run"], lib_path, feeds,
                                    n_outputs, repeat=1)
    return ours, run_s, {"ran_on": "target", "run": on_target["run"], "emulated_ms": ms}


def _keep_io(folder: str, feeds: dict, outputs: list) -> None:
    """The inputs fed (in_<name>.npy) and the outputs the library gave (output_<i>.npy)."""
    for name, value in feeds.items():
        atomic_write(os.path.join(folder, f"in_{_file_name(name)}.npy"), _npy(value))
    for i, value in enumerate(outputs):
        atomic_write(os.path.join(folder, f"output_{i}.npy"), _npy(value))


def _file_name(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _npy(value) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(value))
    return buf.getvalue()


def compare(names: list[str], ours: list, refs: list, rtol: float, atol) -> list[dict]:
    """Per output: max abs and rel error and whether |ours-ref| <= atol + rtol*|ref|."""
    """`atol` is one number or {output name: atol}."""
    rows = []
    for name, y, r in zip(names, ours, refs, strict=True):
        r = np.asarray(r)
        tol = atol[name] if isinstance(atol, dict) else atol
        if y.shape != r.shape:
            rows.append({"name": name, "passed": False,
                         "problem": f"shape {list(y.shape)} != reference {list(r.shape)}"})
            continue
        diff = np.abs(y.astype(np.float64) - r.astype(np.float64))
        rel = diff / np.maximum(np.abs(r.astype(np.float64)), 1e-12)
        ok = bool(np.all(diff <= tol + rtol * np.abs(r)) and np.all(np.isfinite(y)))
        rows.append({"name": name, "max_abs_err": float(diff.max(initial=0.0)),
                     "max_rel_err": float(rel.max(initial=0.0)), "atol": tol, "passed": ok})
    return rows


def _run_here(lib_path: str, feeds: dict, vm: bool) -> tuple[list, float]:
    """(outputs, seconds of the run) of the library on this machine: the graph
    executor's, or the VM's for a VM library (`executor: vm`)."""
    if vm:
        machine = VirtualMachine(lib_path)
        start = time.perf_counter()
        ours = machine.run(**feeds)
        return ours, time.perf_counter() - start
    gm = GraphModule(load_module(lib_path, verify=True)["default"]())
    start = time.perf_counter()
    gm.run(**feeds)
    run_s = time.perf_counter() - start
    return [gm.get_output(i) for i in range(gm.get_num_outputs())], run_s


def _at_highs(model: onnx.ModelProto, shapes: dict, dims: dict) -> dict:
    """Every graph input's shape (the override in `shapes`, else as declared) with
    each symbolic dimension at its upper bound in `dims`."""
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            declared = shapes.get(vi.name) or tuple(
                d.dim_value if d.HasField("dim_value") else d.dim_param
                for d in vi.type.tensor_type.shape.dim)
            out[vi.name] = tuple(dims[d][1] if isinstance(d, str) else d for d in declared)
    return out


def validate_library(lib_path: str, onnx_path: str, shapes: dict, options: dict,
                     model: str, target: str, report_path: str,
                     on_target: dict | None = None, dims: dict | None = None) -> None:
    """Run the library on seeded inputs, compare with the reference, write the
    report (always) and the inputs and outputs to validation/ beside it
    (in_<name>.npy, output_<i>.npy), and raise ValidationError naming model and
    output on a mismatch.

    on_target: for a library this machine cannot load, {"run": the target's run
    prefix or None, "pipeline_run": the target's pipeline-run, "config": the config
    file, "arch": the target's architecture}: the library then runs there
    (pipeline.tools.on_target) and the reference on this machine. Without it the
    library is loaded here. Either way its code digest and blob sha256 are checked.
    For a model of executor aot, lib_path is its program (aot_main.c) and on_target
    also holds "metadata", its metadata.json: the program runs through the run
    prefix, if any. dims: the bounds of a symbolic model's dimensions (its `dims:`):
    it is validated at their highs."""
    shapes = {k: tuple(v) for k, v in shapes.items()}
    if dims:
        shapes = _at_highs(load_model(onnx_path), shapes, dims)
    # The reference runs the model at the shapes the library was built for.
    onnx_model = with_input_shapes(load_model(onnx_path), shapes)
    feeds = random_inputs(onnx_model, shapes, options["seed"])
    names = [o.name for o in onnx_model.graph.output]
    ours, run_s, where = _run_ours(lib_path, feeds, len(names), target, on_target)
    _keep_io(os.path.join(os.path.dirname(report_path), "validation"), feeds, ours)
    start = time.perf_counter()
    refs = reference_outputs(onnx_model, feeds, options["reference"])
    ref_s = time.perf_counter() - start
    rows = compare(names, ours, refs, options["rtol"], output_atols(onnx_model, options))
    report = {"model": model, "target": target, **options, "outputs": rows,
              "passed": all(r["passed"] for r in rows),
              "run_seconds": round(run_s, 4), **where, "reference_seconds": round(ref_s, 4),
              "onnx_opset": onnx_model.opset_import[0].version, "onnx": onnx.__version__}
    atomic_write(report_path, json.dumps(report, indent=1).encode())
    bad = [r for r in rows if not r["passed"]]
    if bad:
        r = bad[0]
        detail = r.get("problem") or (f"max abs error {r['max_abs_err']:.3g}, max rel "
                                      f"error {r['max_rel_err']:.3g}")
        raise ValidationError(f"validation failed: model {model} on {target}, output "
                              f"{r['name']!r}: {detail} (rtol {options['rtol']}, atol "
                              f"{r.get('atol', options['atol']):.3g}); see {report_path}")
