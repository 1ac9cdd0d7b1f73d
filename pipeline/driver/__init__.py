"""Layer 8, the build driver behind `pipeline.build`: `build` (optimise, lower,
compile) and `factory` (GraphExecutorFactory, export_library). Imports any
package below it (transform, lower, plan, codegen, link, runtime.params)."""
