"""Layer 4, lowering: `kernel` (a fused node -> KernelSpec, the kernel IR whose hash
names the kernel) and `sources` (the files that hash covers). Imports ops, ir."""
