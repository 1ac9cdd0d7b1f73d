"""The kernel IR: KernelSpec, one fused kernel described completely.

A spec holds what decides the kernel's machine code and nothing else: the
operator chain with canonical tensor names (argument `a<i>`, temporary `t<i>`;
graph node names are dropped), the argument types, the resolved target, the
LLVM opt level and the version of the code that generates it (kernel_version).
Its content hash is the kernel's identity: two models (or matrix entries) that need the same kernel
get the same hash and share one object file; weights never enter it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache

import llvmlite

from pipeline.errors import GraphError
from pipeline.ir.dims import rename_dim, symbols_of
from pipeline.ir.graph import Graph, Node, TensorType
from pipeline.ir.target import Target
from pipeline.kernels import lowering_of
from pipeline.lower.sources import CODEGEN_ROOTS, kernel_digest, kernel_sources
from pipeline.ops import OpKind, get, infer_types

# Bump when the kernel ABI or object format changes in a way sources don't show.
FORMAT_VERSION = 1


def _roots(op_names: tuple[str, ...]) -> tuple[str, ...]:
    """The code generator's entry points and the kernels modules that registered
    the lowerings of `op_names`."""
    return tuple(sorted({*CODEGEN_ROOTS, *(lowering_of(name).module for name in op_names)}))


def version_sources(op_names: tuple[str, ...]) -> tuple[str, ...]:
    """The modules whose code decides a kernel made of the operators `op_names`:
    the code generator's and those lowering these operators (with what they import)."""
    return kernel_sources(_roots(op_names))


@cache
def kernel_version(op_names: tuple[str, ...]) -> str:
    """The version of a kernel made of the operators `op_names`: a hash of llvmlite's
    version, FORMAT_VERSION and its version_sources (pipeline/lower/sources.py), so
    an edit to one family's lowering recompiles that family's kernels, and an edit
    to an operator definition, numpy reference, sample or ONNX converter none."""
    h = hashlib.sha256(f"{FORMAT_VERSION} llvmlite {llvmlite.__version__}".encode())
    h.update(kernel_digest(_roots(op_names)).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class KernelSpec:
    ops: tuple[Node, ...]            # ops[0] is the anchor; the rest elementwise (verify)
    params: tuple[TensorType, ...]   # arguments: inputs a0..a{n-1}, then the output
    target: Target
    opt_level: int
    version: str

    @property
    def name(self) -> str:
        return "_".join(n.op for n in self.ops)

    def to_json(self) -> str:
        doc = {
            "ops": [{"op": n.op, "inputs": list(n.inputs), "outputs": list(n.outputs),
                     "attrs": [[k, v] for k, v in n.attrs]} for n in self.ops],
            "params": [t.to_json() for t in self.params],
            "target": self.target.key(), "opt_level": self.opt_level,
            "version": self.version,
        }
        return json.dumps(doc, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> KernelSpec:
        doc = json.loads(text)

        def tup(v):
            return tuple(tup(x) for x in v) if isinstance(v, list) else v

        ops = tuple(Node(o["op"], "", tuple(o["inputs"]), tuple(o["outputs"]),
                         tuple((k, tup(v)) for k, v in o["attrs"])) for o in doc["ops"])
        fields = dict(doc["target"])
        target = Target(fields.pop("kind", "llvm"), **fields)
        return KernelSpec(ops, tuple(TensorType(tuple(s), d) for s, d in doc["params"]),
                          target, doc["opt_level"], doc["version"])

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbolic dimensions of the arguments (s0, s1, ... by kernel_spec), in
        the order the kernel's `dims` argument holds their values; () if static."""
        return tuple(symbols_of(*(t.shape for t in self.params)))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:20]

    @property
    def symbol(self) -> str:
        """The exported function name; it embeds the hash so libraries never clash."""
        return f"{self.name}_{self.hash}"

    def verify(self) -> None:
        """Check the spec is well formed; raise GraphError if not."""
        env = {f"a{i}": t for i, t in enumerate(self.params[:-1])}
        for k, node in enumerate(self.ops):
            kind = get(node.op).kind
            if k > 0 and kind != OpKind.ELEMENTWISE:
                raise GraphError(f"kernel {self.name}: {node.op} after the anchor "
                                 "is not elementwise")
            missing = [i for i in node.inputs if i not in env]
            if missing:
                raise GraphError(f"kernel {self.name}: {node.op} reads undefined {missing}")
            (out,) = infer_types(node, [env[i] for i in node.inputs])
            env[node.outputs[0]] = out
        # One tree into the last op: every earlier result is read exactly once (the
        # anchor's running value, and side chains fuse.py merged in, such as a
        # residual Add's DequantizeLinear'd other operand).
        reads = [i for node in self.ops for i in node.inputs if i.startswith("t")]
        for node in self.ops[:-1]:
            if reads.count(node.outputs[0]) != 1:
                raise GraphError(f"kernel {self.name}: the result of {node.op} is not "
                                 "read exactly once")
        if env[self.ops[-1].outputs[0]] != self.params[-1]:
            raise GraphError(f"kernel {self.name}: result type "
                             f"{env[self.ops[-1].outputs[0]]} != output {self.params[-1]}")


# The module that turns a c target's kernel IR into its object (C text, flags).
C_ROOTS = ("pipeline.codegen.c_source",)


@cache
def c_version() -> str:
    """The version of the c target's translation and compile of a kernel: a hash of
    the modules doing them (C_ROOTS: the C they write, its flags)."""
    return hashlib.sha256(kernel_digest(C_ROOTS).encode()).hexdigest()[:12]


def kernel_spec(node: Node, graph: Graph, target: Target, opt_level: int) -> KernelSpec:
    """The KernelSpec of one graph node (a `fused` node, or any single op)."""
    body = node.attr("body") if node.op == "fused" else (node,)
    names = {name: f"a{i}" for i, name in enumerate(node.inputs)}
    ops = []
    for k, inner in enumerate(body):
        inputs = tuple(names[i] for i in inner.inputs)
        names[inner.outputs[0]] = f"t{k}"
        ops.append(Node(inner.op, "", inputs, (f"t{k}",), inner.attrs))
    params = tuple(graph.types[i] for i in node.inputs) + (graph.types[node.outputs[0]],)
    names = symbols_of(*(t.shape for t in params))
    if names:  # s0, s1, ...: the hash says which dims are symbolic, not what they are called
        rename = {n: f"s{k}" for k, n in enumerate(names)}
        params = tuple(TensorType(_renamed(t.shape, rename), t.dtype) for t in params)
        ops = [Node(n.op, n.name, n.inputs, n.outputs, tuple(
            (k, _renamed(v, rename) if k in ("shape", "dims") else v)
            for k, v in n.attrs)) for n in ops]
    version = kernel_version(tuple(n.op for n in ops))
    if target.kind == "c":  # and the C translation's, and how it is compiled
        version = f"{version}+c{c_version()}"
    spec = KernelSpec(tuple(ops), params, target, opt_level, version)
    spec.verify()
    return spec


def _renamed(shape, rename: dict[str, str]) -> tuple:
    """`shape` with each symbol (also inside "a*b", "a+1") renamed by `rename`."""
    return tuple(rename_dim(d, rename) if isinstance(d, str) else d for d in shape)
