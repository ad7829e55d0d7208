"""Layer-wise parallelism (OptCNN, Jia et al., ICML 2018): each layer of the
:class:`~explorer.engine.core.layergraph.LayerGraph` picks a configuration (degrees of its
sample, channel, height, width, length dimensions and a device set).

:mod:`.costmodel` (equation 1's t_C, t_S, t_X and memory; :mod:`.xkernel` its compiled kernels)
-> :mod:`.optcnn` (node and edge elimination, Theorem 1), :mod:`.classic` (data, model, OWT,
Megatron-LM), :mod:`.exhaustive` (brute force, for verification) -> :mod:`.result` ->
:class:`.plan.Plan`.
"""
