"""The registry's entry for ``fsdp`` (ZeRO-3 data parallelism, :func:`.pipeline.fsdp`)."""

from explorer.engine.layerwise.pipeline import fsdp as search

__all__ = ["search"]
