"""The test suite, one folder (package) per area; what tests share is in tests/support.

- unit: graph IR, passes, frontend, codegen, kernel metadata, package layers, sources,
  the docs and the test layout.
- ops: operators end to end against onnxruntime, registry, dtypes, int8, fast kernels.
- build_system: doit builds, incrementality, caches (local, remote, cluster), shards,
  reliability, the Python build API and export path, batch sizes (not "build":
  pytest skips, and .gitignore ignores, folders of that name).
- runtime: the Python and C runtimes, the C executor, load, fuzzing, compile safety.
- cross: cross targets under qemu, the every-CPU compile sweep.
- tools: the CLI, bench, report, model generators, ONNX's backend test suite.
"""
