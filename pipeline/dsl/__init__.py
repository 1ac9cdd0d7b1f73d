"""Layer 1, the kernel DSL: `builder` (KernelBuilder, buffers, loops), `vector`
(explicit vectors, epilogues, parallel_for) and `gemm_tile` (the shared
register-tiled GEMM). Imports only `ir` and `errors`, never the operators."""
