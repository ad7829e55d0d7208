"""What every family shares, upstream of all of them: capture (:mod:`.models` loads a model by
name, :mod:`.capture` traces it, :mod:`.importer` builds the :class:`~.layergraph.LayerGraph`,
:mod:`.opgraph` the joint forward+backward operator graph, :mod:`.capture_cache` keeps both
across processes, :mod:`.hf` builds Hugging Face architectures), device graphs
(:mod:`.devices`), the one geometry (:mod:`.geometry`), pins (:mod:`.pins`), operator costs
(:mod:`.flops`, :mod:`.roofline`, the measured :mod:`.profile` store), plan documents
(:mod:`.plandoc`) and storage (:mod:`.storage`, :mod:`.history`).  Nothing here imports a
method family, the search registry, the runtime or the export (``tests/test_architecture.py``).
"""
