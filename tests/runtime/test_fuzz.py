"""Property-based fuzzing (Hypothesis) of the readers of untrusted bytes: the param
dict (load_params), the blob (unpack_blob), the graph JSON the executor plan is
made of (encode_plan; the C reader of the plan has its own libFuzzer target,
tests/runtime/fuzz_blob.c) and the ONNX frontend's checks. The property: any input is
either accepted or refused with a PipelineError carrying a message; no other
exception escapes, nothing crashes, nothing allocates beyond the element limit.

Derandomized, so CI sees the same inputs every run, a few seconds per target.
By hand, more inputs:  PIPELINE_FUZZ_EXAMPLES=20000 python -m pytest -q tests/runtime/test_fuzz.py
(each test prints nothing; `-s --hypothesis-show-statistics` shows the counts).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import struct

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from pipeline.errors import PipelineError
from pipeline.frontend import from_onnx
from pipeline.link.blob import BLOB_FIXED, BLOB_MAGIC, BLOB_TABLE, BLOB_VERSION, pack_blob
from pipeline.link.plan import encode_plan
from pipeline.runtime.blob import unpack_blob
from pipeline.runtime.params import load_params, save_params

EXAMPLES = int(os.environ.get("PIPELINE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(autouse=True, scope="module")
def small_limit():
    """A mutated shape may be large but legal; keep what a reader may allocate small."""
    old = os.environ.get("PIPELINE_MAX_TENSOR_ELEMENTS")
    os.environ["PIPELINE_MAX_TENSOR_ELEMENTS"] = str(1 << 16)
    yield
    if old is None:
        del os.environ["PIPELINE_MAX_TENSOR_ELEMENTS"]
    else:
        os.environ["PIPELINE_MAX_TENSOR_ELEMENTS"] = old


def accepted_or_refused(fn, *args) -> None:
    """Call fn(*args): success, or a PipelineError with a one-line message."""
    try:
        fn(*args)
    except PipelineError as err:
        assert str(err).strip(), f"{type(err).__name__} without a message"


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """`seed` with a few byte flips, overwrites, insertions, deletions or a cut."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut", "int"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif kind == "cut":
            del data[at:]
        elif kind == "int" and len(data) >= at + 8:  # a length or dimension field
            data[at:at + 8] = struct.pack("<q", draw(st.sampled_from(
                [-1, 0, 1, 2**31, 2**32 + 1, 2**62, -(2**63), 2**63 - 1])))
    return bytes(data)


# -- load_params -------------------------------------------------------------------------

PARAMS = save_params({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                      "b": np.array([1, -2], dtype=np.int64),
                      "m": np.array([True, False])})


@FUZZ
@given(st.one_of(mutated(PARAMS), st.binary(max_size=200)))
def test_fuzz_load_params(data: bytes):
    accepted_or_refused(load_params, data)


# -- the blob ----------------------------------------------------------------------------

EMPTY_GRAPH = json.dumps({"nodes": [], "arg_nodes": [], "heads": [], "node_row_ptr": [0],
                          "attrs": {"shape": ["list_shape", []], "dltype": ["list_str", []],
                                    "storage_id": ["list_int", []]}})
BLOB = pack_blob(EMPTY_GRAPH, PARAMS, ["k_a", "k_b"], "llvm -mcpu=x86-64")

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats()
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


def forged(header: bytes, body: bytes) -> bytes:
    """A blob whose lengths and checksum are right around any header and body."""
    total = BLOB_FIXED.size + BLOB_TABLE.size + len(header) + len(body) + 64
    # The binary table is the C executor's; the Python reader takes the JSON's.
    head = (BLOB_FIXED.pack(BLOB_MAGIC, BLOB_VERSION, 0, total, len(header))
            + bytes(BLOB_TABLE.size) + header + body)
    return head + hashlib.sha256(head).digest() + bytes(32)


@st.composite
def forged_headers(draw) -> bytes:
    """A well-checksummed blob with a header that is valid JSON of any shape, or the
    real header with one value replaced."""
    start = BLOB_FIXED.size + BLOB_TABLE.size
    header = json.loads(BLOB[start:start + BLOB_FIXED.unpack_from(BLOB)[4]])
    if draw(st.booleans()):
        header = draw(JSON)
    else:
        key = draw(st.sampled_from(sorted(header)))
        header[key] = draw(JSON) if draw(st.booleans()) else [
            {"name": draw(st.sampled_from(["graph", "params", "x"])),
             "offset": draw(st.integers(-10, 400)), "size": draw(st.integers(-10, 400))}]
    return forged(json.dumps(header).encode(), draw(st.binary(max_size=64)))


@FUZZ
@given(st.one_of(mutated(BLOB), forged_headers(), st.binary(max_size=100)))
def test_fuzz_unpack_blob(data: bytes):
    accepted_or_refused(unpack_blob, data, "fuzz.so")


# -- the graph JSON, read into the executor plan --------------------------------------------

GRAPH = {
    "nodes": [{"op": "null", "name": "x", "inputs": []},
              {"op": "null", "name": "w", "inputs": []},
              {"op": "tvm_op", "name": "add", "inputs": [[0, 0, 0], [1, 0, 0]],
               "attrs": {"func_name": "k_add", "num_inputs": "2", "num_outputs": "1"}},
              {"op": "tvm_op", "name": "copy", "inputs": [[2, 0, 0]],
               "attrs": {"func_name": "__copy", "num_inputs": "1", "num_outputs": "1"}}],
    "arg_nodes": [0, 1], "heads": [[3, 0, 0]], "node_row_ptr": [0, 1, 2, 3, 4],
    "attrs": {"shape": ["list_shape", [[2, 3], [2, 3], [2, 3], [2, 3]]],
              "dltype": ["list_str", ["float32"] * 4],
              "storage_id": ["list_int", [0, 1, 2, 3]]},
}


@st.composite
def mutated_graphs(draw) -> str:
    """The graph JSON with one to three values (anywhere in the tree) replaced."""
    graph = copy.deepcopy(GRAPH)
    for _ in range(draw(st.integers(1, 3))):
        parent, key = None, None
        node = graph
        for _ in range(draw(st.integers(1, 5))):
            if isinstance(node, dict) and node:
                parent, key = node, draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                parent, key = node, draw(st.integers(0, len(node) - 1))
            else:
                break
            node = parent[key]
        if parent is not None:
            parent[key] = draw(JSON | st.integers(-3, 5))
    return json.dumps(graph)


@FUZZ
@given(st.one_of(mutated_graphs(), mutated(json.dumps(GRAPH).encode()).map(
    lambda b: b.decode("utf-8", "replace"))))
def test_fuzz_graph_json(text: str):
    accepted_or_refused(encode_plan, text)


# -- the ONNX frontend -----------------------------------------------------------------------

def small_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                              name="pool"),
             helper.make_node("Reshape", ["p", "shape"], ["f"], name="reshape"),
             helper.make_node("Softmax", ["f"], ["y"], axis=1, name="softmax")]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


MODEL = small_model()
MODEL_BYTES = MODEL.SerializeToString()
OPS = ["Conv", "Relu", "MaxPool", "Reshape", "Softmax", "Add", "Gemm", "Concat", "Transpose",
       "Flatten", "BatchNormalization", "Identity", "Slice", "Gather", "ReduceMean", "Unknown"]
NAMES = ["x", "w", "b", "c", "r", "p", "f", "y", "shape", "", "nope"]


@st.composite
def edited_models(draw) -> onnx.ModelProto:
    """The small model with one to three structural edits: op types, inputs, outputs,
    attribute values and types, dims and element types of tensors."""
    model = onnx.ModelProto.FromString(MODEL_BYTES)
    g = model.graph
    for _ in range(draw(st.integers(1, 3))):
        node = g.node[draw(st.integers(0, len(g.node) - 1))]
        kind = draw(st.sampled_from(["op", "input", "output", "attr", "dims", "elem",
                                     "drop", "opset", "init"]))
        if kind == "op":
            node.op_type = draw(st.sampled_from(OPS))
        elif kind == "input":
            if node.input and draw(st.booleans()):
                node.input[draw(st.integers(0, len(node.input) - 1))] = draw(
                    st.sampled_from(NAMES))
            else:
                node.input.append(draw(st.sampled_from(NAMES)))
        elif kind == "output" and node.output:
            node.output[0] = draw(st.sampled_from(NAMES))
        elif kind == "attr":
            name = draw(st.sampled_from(["pads", "kernel_shape", "strides", "axis", "group",
                                         "dilations", "perm", "auto_pad", "transB"]))
            value = draw(st.one_of(st.integers(-5, 70),
                                   st.lists(st.integers(-3, 9), min_size=1, max_size=6),
                                   st.text(max_size=6), st.floats(allow_nan=True)))
            for i, a in enumerate(node.attribute):
                if a.name == name:
                    del node.attribute[i]
                    break
            node.attribute.append(helper.make_attribute(name, value))
        elif kind == "dims":
            vi = draw(st.sampled_from([*g.input, *g.output]))
            dims = draw(st.lists(st.integers(-2, 2**40), max_size=5))
            del vi.type.tensor_type.shape.dim[:]
            for d in dims:
                vi.type.tensor_type.shape.dim.add().dim_value = d
        elif kind == "elem":
            vi = draw(st.sampled_from([*g.input, *g.output]))
            vi.type.tensor_type.elem_type = draw(st.integers(0, 17))
        elif kind == "drop" and len(g.node) > 1:
            del g.node[draw(st.integers(0, len(g.node) - 1))]
        elif kind == "opset":
            model.opset_import[0].version = draw(st.integers(1, 25))
        elif kind == "init":
            init = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            if draw(st.booleans()):
                init.dims[0] = draw(st.integers(-1, 2**40))
            else:
                init.raw_data = draw(st.binary(max_size=40))
    return model


@st.composite
def byte_mutated_models(draw) -> onnx.ModelProto | None:
    try:
        return onnx.ModelProto.FromString(draw(mutated(MODEL_BYTES)))
    except Exception:  # not a protobuf any more: load_model's concern, tested elsewhere
        return None


@FUZZ
@given(st.one_of(edited_models(), byte_mutated_models()))
def test_fuzz_onnx_frontend(model):
    if model is not None:
        accepted_or_refused(from_onnx, model, None, "fuzz")


def test_the_seeds_are_accepted():
    """The unmutated seeds load: the properties above test refusals of changes."""
    assert set(load_params(PARAMS)) == {"w", "b", "m"}
    assert unpack_blob(BLOB, "seed").kernels == ("k_a", "k_b")
    assert encode_plan(json.dumps(GRAPH))
    graph, _ = from_onnx(MODEL, None, "seed")
    assert graph.types["y"].shape == (1, 64)
