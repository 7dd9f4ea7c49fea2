"""The scaled_mm family's runtime (hand-written)."""
