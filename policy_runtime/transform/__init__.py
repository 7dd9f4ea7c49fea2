"""The transform family's runtime (hand-written)."""
