"""Argument checks shared by the builders: one ``ValueError`` naming the model and the numbers."""

from __future__ import annotations


def positive(model: str, **values: float) -> None:
    """Every value must be > 0 (sizes, counts, multipliers)."""
    for key, value in values.items():
        if not value > 0:
            raise ValueError(f"{model}: {key} must be >= 1, got {value}" if isinstance(value, int)
                             else f"{model}: {key} must be > 0, got {value}")


def divisible(model: str, name: str, value: int, by_name: str, by: int) -> None:
    """``value`` must be a multiple of ``by`` (hidden by heads, image size by patch, ...)."""
    if value % by:
        raise ValueError(f"{model}: {name} ({value}) must be divisible by {by_name} ({by})")
