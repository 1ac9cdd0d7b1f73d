"""The errors a user can cause. Each carries one line naming what is at fault.

The doit tasks catch `PipelineError` and print its message as the task's one
error line; anything else is a bug in the compiler and keeps its traceback.
"""


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
