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
        # A model with dims: keeps its symbolic dimensions (the argument only then, so
        # every other model's action key is as before).
        dims = [{k: list(v) for k, v in m.dims.items()}] if m.dims else []
        yield sel.cached_stage(
            m.name, "tasks.stages:import_model", [onnx_path(m), shapes, ir, weights, *dims],
            [onnx_path(m), *front_src], [ir, weights],
            [options_changed({"inputs": shapes, **({"dims": dims[0]} if dims else {})},
                             "input"), sel.fetched])


CREATORS = (task_model, task_import)
