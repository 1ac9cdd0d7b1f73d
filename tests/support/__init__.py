"""What the tests share; no test module imports another (tests/unit/test_test_imports.py).

- onnx_models: small ONNX models (make_model, rand, tiny_convnet, tiny_bench_model,
  tiny_loop_if: a Loop and an If for the VM).
- compare: a model through our pipeline (build, export, load, run) and onnxruntime.
- doit_runner: `python -m doit` on a folder in a subprocess, as a user runs it.
- checkouts: a folder with the tiny conv-net and its matrix.yaml.
- build_outputs: what a build left in out/ (build report, kernel hashes, bytes).
- op_cases: the operator test cases (also compiled for every CPU by the sweep).
- nn_cases, fast_kernels: helpers of the neural-network and fast-kernel op tests.
- soak: one library run from many threads in a process of its own (test_load).
- vm_soak: one VM library run many times in a process of its own (test_vm_control).
- cli_runner: the `pipeline` command in a subprocess (the CLI tests).
- fuzz_seeds: the graph the blob and .ro fuzzers start from.
- toolchains, servers, browser: external tools (skipped when missing, failed under CI).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout these tests test
