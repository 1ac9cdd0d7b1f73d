"""The model family: the ONNX files the build writes (model) and their import
into the graph IR (import)."""

from __future__ import annotations

import os

from pipeline.tasks.explain import options_changed
from pipeline.tasks.paths import imported, onnx_path
from pipeline.tasks.selection import Selection, code_of


def task_model(sel: Selection):
    """Generate the ONNX files of models built by models/ generators, and of path
    models with random weights."""
    from models import reweight_sources, source_files

    for m in sel.models:
        if m.random_weights is not None:
            src = os.path.relpath(m.path)
            deps = [src, *(os.path.relpath(p) for p in reweight_sources())]
            yield sel.cached_stage(
                m.name, "tasks.stages:reweight_model", [src, onnx_path(m), m.random_weights],
                deps, [onnx_path(m)],
                [options_changed({"random_weights": m.random_weights}, "random_weights"),
                 sel.fetched])
        elif m.generator:
            deps = [os.path.relpath(p) for p in source_files(m.generator)]
            yield sel.cached_stage(
                m.name, "tasks.stages:generate_model", [m.generator, onnx_path(m), dict(m.args)],
                deps, [onnx_path(m)],
                [options_changed({"args": dict(m.args)}, "generator"), sel.fetched])


def task_import(sel: Selection):
    """Import each ONNX model into the graph IR."""
    front_src = code_of("tasks.stages:import_model")
    for m in sel.models:
        ir, weights = imported(m)
        shapes = {k: list(v) for k, v in m.inputs.items()}
        # If, Loop and Scan are kept (as nodes holding subgraphs) for a model the VM
        # runs somewhere in the config, whatever this run selects; a model with dims:
        # keeps its symbolic dimensions. Each argument is passed only when set, so the
        # other models' imports are as before.
        flow = _runs_in_vm(sel, m)
        dims = {k: list(v) for k, v in m.dims.items()} if m.dims else None
        extra = [flow, dims] if dims else [True] if flow else []
        opts = {"inputs": shapes, **({"control_flow": True} if flow else {}),
                **({"dims": dims} if dims else {})}
        yield sel.cached_stage(
            m.name, "tasks.stages:import_model", [onnx_path(m), shapes, ir, weights, *extra],
            [onnx_path(m), *front_src], [ir, weights],
            [options_changed(opts, "input"), sel.fetched])


def _runs_in_vm(sel: Selection, m) -> bool:
    """Whether an entry of model m, in the whole config, is built for the VM (the
    model's executor, else a target's: executor_of's rule, without its check of
    entries this run may not build)."""
    targets = sel.config.targets.values() if sel.config is not None else sel.targets
    return m.executor == "vm" or (m.executor is None
                                  and any(t.executor == "vm" for t in targets))


CREATORS = (task_model, task_import)
