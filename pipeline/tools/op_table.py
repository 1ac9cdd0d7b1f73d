"""The table of supported ONNX operators, docs/operators.md, generated from the converter
registry (what each converter declares at its `onnx_op` registration).

    python -m pipeline.tools.op_table > docs/operators.md

tests/unit/test_docs.py fails when the file differs from `render_operator_table()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# The one place this module names the registry: op_type -> its converters, oldest first.
from pipeline.frontend.onnx import ONNX_CONVERTERS

__all__ = ["render_operator_table"]

REGENERATE = "python -m pipeline.tools.op_table > docs/operators.md"

_HEADER = f"""# Supported ONNX operators

Generated from the converter registry, do not edit by hand: after changing a
converter, run `{REGENERATE}`
(`tests/unit/test_docs.py` fails when this file is stale). Each row is one ONNX operator
type, as its converters declare it at registration (`onnx_op(op_type, since,
emits=..., build_time_inputs=..., limits=...)`):

- **opsets**: the opset each converter starts from (a model's opset picks the
  newest one not newer than it);
- **graph ops**: the graph-IR operators its converters may produce ("none": the
  result is a build-time constant);
- **float64**: whether float64 tensors are accepted: every graph op it emits lowers
  float64 (otherwise a float64 tensor is a ModelError naming the node);
- **uint64**: the same for uint64 (the graph ops move its bits only, or pick unsigned
  instructions for it);
- **build-time inputs**: input positions (from 0) that must be constants at build
  time, because they decide shapes or loop bounds;
- **not implemented**: the operator features the converter declares it lacks; a
  model using one is refused with that reason (and the ONNX backend skips its test);
- **family**: the module of the converter.

Where a column differs between a type's converters, it is given per opset.

"""

_COLUMNS = ("ONNX op", "domain", "opsets", "graph ops", "float64", "uint64",
            "build-time inputs", "not implemented", "family")


def _per_opset(converters: Sequence, value: Callable[[object], str]) -> str:
    """`value` of the converters: once when they agree, else "opset N: v" for each."""
    texts = [value(c) for c in converters]
    if len(set(texts)) == 1:
        return texts[0]
    return "; ".join(f"opset {c.since}: {t}" for c, t in zip(converters, texts, strict=True))


def _row(key: str, converters: Sequence) -> list[str]:
    """The table cells of one ONNX op type (`key` is "domain.Op" outside the default
    domain)."""
    domain, _, op_type = key.rpartition(".")
    emitted = sorted({op for c in converters for op in c.emits})
    reasons = list(dict.fromkeys(limit.reason for c in converters for limit in c.limits))
    families = dict.fromkeys(c.fn.__module__.rpartition(".")[2] for c in converters)
    return [
        op_type,
        domain,
        ", ".join(str(c.since) for c in converters),
        ", ".join(emitted) if emitted else "none",
        _per_opset(converters, lambda c: "yes" if c.float64 else "no"),
        _per_opset(converters, lambda c: "yes" if c.uint64 else "no"),
        _per_opset(converters,
                   lambda c: ", ".join(map(str, c.build_time_inputs)) or "none"),
        "; ".join(reasons),
        ", ".join(families),
    ]


def _cell(text: str) -> str:
    """Markdown-safe table cell text."""
    return text.replace("|", "\\|")


def render_operator_table() -> str:
    """The whole of docs/operators.md: an explanation, counts and one row per ONNX op
    type (default domain first, then the others, each alphabetical)."""
    keys = sorted(ONNX_CONVERTERS, key=lambda k: ("." in k, k.lower()))
    other_domains = sum("." in k for k in keys)
    lines = [_HEADER.rstrip("\n"), "",
             f"{len(keys)} operator types: {len(keys) - other_domains} of the default "
             f"domain (ai.onnx), {other_domains} of others.", "",
             "| " + " | ".join(_COLUMNS) + " |",
             "|" + "---|" * len(_COLUMNS)]
    for key in keys:
        cells = _row(key, ONNX_CONVERTERS[key])
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_operator_table(), end="")
