"""The attention family's runtime (hand-written)."""
