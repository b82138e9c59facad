"""Models built on the flow: families of models that manymodels fits itself.

``mm.linear`` (:mod:`.linear`): one linear model per group, all fitted at once
by batched kernels, stored as one artifact. It reads inputs, hashes its
identity and writes to the store, without the engine's per-task loop.
"""
