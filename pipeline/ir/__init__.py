"""Layer 0, the graph IR: `graph` (Graph, Node, TensorType, dtypes) and `target`
(Target, parse_target). Imports only `pipeline.errors` (and llvmlite.binding to
resolve a target against the host)."""
