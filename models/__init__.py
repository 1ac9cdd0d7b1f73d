"""Generators for the standard models the pipeline compiles, written as ONNX files.

`GENERATORS` maps a model name to a function that builds its ModelProto in memory;
`generate(name, path)` builds, checks and atomically writes one; `source_files(name)`
lists the Python files a generator's output depends on, for the build tool's file_dep.
Generation is deterministic (seeded weights, no timestamps), so regenerating after an
unrelated source edit yields a byte-identical file and downstream tasks stay up to date.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import onnx

from models import _onnx
from models.mlp import mlp
from models.resnet import resnet18, resnet50

__all__ = ["GENERATORS", "generate", "source_files"]

GENERATORS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": mlp,
    "resnet18": resnet18,
    "resnet50": resnet50,
}


def _generator(name: str) -> Callable[[], onnx.ModelProto]:
    try:
        return GENERATORS[name]
    except KeyError:
        allowed = ", ".join(sorted(GENERATORS))
        raise ValueError(f"unknown model {name!r}; allowed: {allowed}") from None


def source_files(name: str) -> list[Path]:
    """Python files whose contents determine model `name`'s ONNX file, sorted.

    Takes a generator name (ValueError if unknown); returns absolute paths: the
    generator's own module, the shared builder, and this file (which checks and writes).
    A generator that starts importing another helper module must be listed here too.
    """
    module = sys.modules[_generator(name).__module__]
    files = {Path(__file__), Path(_onnx.__file__), Path(module.__file__)}
    return sorted(p.resolve() for p in files)


def generate(name: str, path: str | Path) -> None:
    """Build model `name`, check it, and write it to `path` atomically.

    Takes a generator name (ValueError if unknown) and a destination file; returns
    nothing. Parent directories are created. The bytes go to a temporary file in the
    same directory, which then replaces `path` with os.replace, so a reader (or an
    interrupted build) sees either the old file or the complete new one, never a
    partial write. On any failure the temporary file is removed and `path` is untouched.
    """
    model = _generator(name)()
    # full_check also runs strict shape inference, catching shape errors here
    # rather than in the compiler.
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique hidden name: concurrent writers never share a temp file, and a leftover
    # after a hard kill is recognisably ours.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open with 0o666 (not tempfile, whose 0o600 would survive the rename)
        # so the final file gets ordinary umask permissions.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
