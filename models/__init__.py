"""Generators for the standard models the pipeline compiles, written as ONNX files.

`GENERATORS` maps a model name to the "module:function" that builds its ModelProto in
memory; `build(name, args)` calls it, `generate(name, path, args)` builds, checks and
atomically writes one (`args`: keyword arguments, those of ARGUMENTS, e.g. {"batch": 8});
`source_files(name)` lists the Python files a generator's output depends on, for the
build tool's file_dep. Generation is deterministic (seeded weights, no
timestamps), so regenerating after an unrelated source edit yields a byte-identical
file and downstream tasks stay up to date.

Importing this package imports neither onnx nor numpy (every doit run reads
GENERATORS and source_files, and a no-op build must stay fast): generator modules
are imported only when a model is actually built.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["ARGUMENTS", "GENERATORS", "OWN_ARGUMENTS", "build", "generate", "reweight_sources",
           "source_files"]

GENERATORS: dict[str, str] = {
    "mlp": "models.mlp:mlp",
    "resnet18": "models.resnet:resnet18",
    "resnet50": "models.resnet:resnet50",
    "resnet18_fp16": "models.resnet:resnet18_fp16",
    "mobilenet_v2": "models.mobilenet:mobilenet_v2",
    "bert_encoder": "models.bert:bert_encoder",
    "unet": "models.unet:unet",
    "lstm_gru_seq": "models.seq:lstm_gru_seq",
    # int8 models made by onnxruntime's quantizer (needs the ort extra)
    "resnet18_qdq": "models.quantized:resnet18_qdq",
    "mobilenet_v2_qop": "models.quantized:mobilenet_v2_qop",
    "bert_encoder_dyn": "models.quantized:bert_encoder_dyn",
}
# Generators that start from another generator's model: its module is a source too.
BASED_ON = {"resnet18_qdq": "models.resnet", "mobilenet_v2_qop": "models.mobilenet",
            "bert_encoder_dyn": "models.bert"}

# The keyword arguments every generator takes, with what each must be
# (pipeline/tasks/config.py checks a config's `args:` against them).
ARGUMENTS: dict[str, str] = {
    "batch": "a positive integer: the batch size of the model's input and output",
}
# Arguments only some generators take: generator -> {argument: what it must be}.
OWN_ARGUMENTS: dict[str, dict[str, str]] = {
    "mlp": {"size": "a positive integer: the input image's height and width (224)"},
}


def _target(name: str) -> tuple[str, str]:
    """(module, function) of generator `name`; ValueError naming the choices if unknown."""
    try:
        module, _, function = GENERATORS[name].partition(":")
    except KeyError:
        allowed = ", ".join(sorted(GENERATORS))
        raise ValueError(f"unknown model {name!r}; allowed: {allowed}") from None
    return module, function


def build(name: str, args: dict | None = None) -> onnx.ModelProto:
    """Run generator `name` (ValueError if unknown) with keyword arguments `args` (see
    ARGUMENTS) and return its ModelProto, unchecked."""
    module, function = _target(name)
    return getattr(importlib.import_module(module), function)(**(args or {}))


def source_files(name: str) -> list[Path]:
    """Python files whose contents determine model `name`'s ONNX file, sorted.

    Takes a generator name (ValueError if unknown); returns absolute paths: the
    generator's own module, the shared builder, and this file (which checks and writes).
    The generator's module is located without being imported. A generator that starts
    importing another helper module must be listed here too.
    """
    module, _ = _target(name)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"model {name!r}: generator module {module!r} not found")
    here = Path(__file__)
    files = {here, here.with_name("_onnx.py"), Path(spec.origin)}
    if name in BASED_ON:
        files.add(Path(importlib.util.find_spec(BASED_ON[name]).origin))
    return sorted(p.resolve() for p in files)


def reweight_sources() -> list[Path]:
    """Python files whose contents determine a path model's random weights
    (models/reweight.py and its He-normal draw), for the build tool's file_dep."""
    here = Path(__file__)
    return sorted(p.resolve() for p in (here.with_name("_onnx.py"),
                                         here.with_name("reweight.py")))


def generate(name: str, path: str | Path, args: dict | None = None) -> None:
    """Build model `name` with `args`, check it, and write it to `path` atomically.

    Takes a generator name (ValueError if unknown), a destination file and the
    generator's keyword arguments; returns
    nothing. Parent directories are created. The bytes go to a temporary file in the
    same directory, which then replaces `path` with os.replace, so a reader (or an
    interrupted build) sees either the old file or the complete new one, never a
    partial write. On any failure the temporary file is removed and `path` is untouched;
    a file that already holds the same bytes is left as it is (mtime too).
    """
    import onnx

    from pipeline.files import atomic_write

    data = build(name, args).SerializeToString()  # once: the checker takes the bytes
    # full_check also runs strict shape inference, catching shape errors here
    # rather than in the compiler.
    onnx.checker.check_model(data, full_check=True)
    atomic_write(path, data)
