"""Layer 5, code generation: `render` (KernelSpec -> LLVM IR text, through the
operators' lowerings) and `compile` (text -> object). Imports lower, ops, dsl, ir."""
