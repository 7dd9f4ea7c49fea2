"""The cache family's runtime (hand-written)."""
