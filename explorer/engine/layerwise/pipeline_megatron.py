"""The registry's entry for ``megatron-3d`` (tp × pp × dp, :func:`.pipeline.megatron3d`)."""

from explorer.engine.layerwise.pipeline import megatron3d as search

__all__ = ["search"]
