"""What the doit-level tests build in a folder: a tiny checkout (the small conv-net
and a one-model matrix in a folder of its own) and the build matrix writer."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.onnx_models import tiny_convnet

TARGET = '{target: "llvm -mcpu=native", opt_level: 3}'


def matrix(tmp: Path, models: str, targets: str = f"llvm: {TARGET}\n") -> None:
    """Write tmp/matrix.yaml with the given `models:` and `targets:` sections (YAML)."""
    (tmp / "matrix.yaml").write_text(
        "models:\n" + textwrap.indent(textwrap.dedent(models), "  ")
        + "targets:\n" + textwrap.indent(textwrap.dedent(targets), "  ")
        + "validate: {reference: onnx, rtol: 1.0e-4, atol: 1.0e-4}\n")


def tiny_checkout(folder: Path, targets: str = f"llvm: {TARGET}\n", extra: str = "") -> Path:
    """`folder` with nets/tiny.onnx and matrix.yaml building it (plus `extra` YAML)."""
    tiny_convnet(folder / "nets" / "tiny.onnx")
    matrix(folder, "tiny: {path: nets/tiny.onnx}\n", targets)
    if extra:
        with open(folder / "matrix.yaml", "a") as f:
            f.write(extra)
    return folder

