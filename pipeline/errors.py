"""The errors a user can cause. Each carries one line naming what is at fault.

The doit tasks catch `PipelineError` and print its message as the task's one
error line; anything else is a bug in the compiler: run_stage writes its traceback to
out/logs/<task>.log and prints one line pointing there.
"""

import os


class PipelineError(Exception):
    """Base of every user-facing error."""


class ModelError(PipelineError):
    """An ONNX file that cannot be read or is not well formed."""


class UnsupportedOperatorError(ModelError):
    """The model uses operators (at some opset) the frontend cannot import."""


class GraphError(PipelineError):
    """A graph that breaks an IR invariant (a compiler bug, or a bad hand-made graph)."""


class ConfigError(PipelineError):
    """A YAML build configuration with a wrong key, type or value."""


class LimitError(PipelineError, ValueError):
    """A declared size beyond what the build or the runtime agrees to allocate."""


class OutputError(PipelineError, OSError):
    """An artifact that could not be written (disk full, permissions); names the file."""


class FormatError(PipelineError, ValueError):
    """Bytes that do not parse as the format they claim (param dict, graph JSON, tar)."""


# 2**34 elements (64 GiB of float32): far beyond any model this compiler targets,
# far below what overflows an int64 byte count. PIPELINE_MAX_TENSOR_ELEMENTS lowers
# (or raises) it, e.g. for a machine with little memory.
MAX_ELEMENTS_ENV = "PIPELINE_MAX_TENSOR_ELEMENTS"
DEFAULT_MAX_ELEMENTS = 1 << 34


def check_elements(shape, what: str) -> int:
    """The element count of `shape` (any sequence of ints), checked before anything
    is allocated: LimitError naming `what` for a negative dimension or a count over
    the limit ($PIPELINE_MAX_TENSOR_ELEMENTS, default 2**34). Python ints, so no
    product can overflow on the way."""
    limit = int(os.environ.get(MAX_ELEMENTS_ENV) or DEFAULT_MAX_ELEMENTS)
    count = 1
    for d in shape:
        if isinstance(d, str):  # a symbolic dimension (the VM's): bounded elsewhere
            continue
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise LimitError(f"{what}: shape {list(shape)} has an invalid dimension {d!r}")
        count *= d
    if count > limit:
        raise LimitError(f"{what}: shape {list(shape)} has {count} elements, more than the "
                         f"limit of {limit} (${MAX_ELEMENTS_ENV})")
    return count
