"""CUB-style sizing helpers the generated dispatch module re-exports (hand-written)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_smem", "grid_even_share"]


def check_smem(threads: int, items: int, elem_bytes: int, smem_limit: int) -> dict[str, Any]:
    """Does a tile of ``threads * items`` elements of ``elem_bytes`` fit ``smem_limit`` bytes?

    Returns tile_bytes, fits, utilization (tile_bytes / smem_limit, 0 for a
    zero limit) and max_items (the most items per thread that fit, 0 when
    threads * elem_bytes is 0).
    """
    tile_bytes = threads * items * elem_bytes
    per_item_row = threads * elem_bytes
    return {
        "tile_bytes": tile_bytes,
        "fits": tile_bytes <= smem_limit,
        "utilization": tile_bytes / smem_limit if smem_limit > 0 else 0,
        "max_items": smem_limit // per_item_row if per_item_row > 0 else 0,
    }


def grid_even_share(num_items: int, tile_size: int, sm_count: int, subscription_factor: int = 5) -> dict[str, Any]:
    """CUB GridEvenShare sizing: at most ``sm_count * subscription_factor`` blocks.

    Tiles are spread evenly; ``big_shares`` blocks take one tile more than
    ``avg_tiles_per_block``.  Empty input gives a zero grid.
    """
    if num_items <= 0 or tile_size <= 0:
        return {"grid_size": 0, "total_tiles": 0}
    total_tiles = math.ceil(num_items / tile_size)
    grid_size = min(total_tiles, sm_count * subscription_factor)
    avg_tiles = total_tiles // grid_size if grid_size > 0 else 0
    return {
        "grid_size": grid_size,
        "total_tiles": total_tiles,
        "avg_tiles_per_block": avg_tiles,
        "big_shares": total_tiles - avg_tiles * grid_size if grid_size > 0 else 0,
        "tile_size": tile_size,
    }
