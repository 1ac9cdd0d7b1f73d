"""Layer 4 beside plan, the VM executable (`executor: vm`): its bytecode
(bytecode.py), the compiler from an executor plan to VM functions (compile.py) and
the `.ro` file format (format.py). Imports ir and plan only; the runtime reads
.ro files through format.py, which imports nothing of the compiler."""
