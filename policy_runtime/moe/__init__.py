"""The moe family's runtime (hand-written)."""
