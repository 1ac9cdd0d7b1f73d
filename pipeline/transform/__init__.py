"""Layer 4, graph-level optimisation: PassContext (all options) and the pass pipeline.
Imports ops, ir and errors.

The pipeline itself (pipeline/transform/passes.py: PIPELINE, optimize) loads
on first use, so reading a build config (PassContext, PASS_NAMES) does not
import the passes, the operators and numpy.
"""

import importlib

from pipeline.transform.context import CONFIG_OPTIONS, PASS_NAMES, PassConfig, PassContext
from pipeline.transform.instrument import PassInfo, PassInstrument, PassTimingInstrument

__all__ = ["CONFIG_OPTIONS", "PIPELINE", "PASS_NAMES", "Pass", "PassConfig", "PassContext",
           "PassInfo", "PassInstrument", "PassTimingInstrument", "optimize"]


def __getattr__(name: str):
    if name in ("PIPELINE", "Pass", "optimize"):
        return getattr(importlib.import_module("pipeline.transform.passes"), name)
    raise AttributeError(f"module 'pipeline.transform' has no attribute {name!r}")
