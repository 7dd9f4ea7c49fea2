"""The matmul family's runtime (hand-written)."""
