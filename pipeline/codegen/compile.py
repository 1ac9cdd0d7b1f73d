"""Compile: LLVM IR text -> relocatable object bytes, with llvmlite.

Parsing verifies the module; the new pass manager runs the O<n> pipeline for
the target machine (so vectorisation sees the real vector width); the target
machine emits an ELF object. The output depends only on (text, triple, cpu,
features, opt level), which is what the kernel hash already covers.
"""

from __future__ import annotations

import llvmlite.binding as llvm

from pipeline.ir.target import Target


def optimize_ir(text: str, target: Target, opt_level: int = 3):
    """Parse, verify and optimise `text`; returns the llvmlite ModuleRef."""
    tm = target.target_machine(opt_level)
    module = llvm.parse_assembly(text)
    module.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    builder = llvm.create_pass_builder(tm, pto)
    builder.getModulePassManager().run(module, builder)
    return module


def compile_ir(text: str, target: Target, opt_level: int = 3) -> bytes:
    """Object-file bytes for the module in `text`."""
    return target.target_machine(opt_level).emit_object(optimize_ir(text, target, opt_level))
