"""Layer 10, tools outside the build: the ONNX backend and its conformance report,
validation against the reference, benchmarks. May import every other package."""
