"""The kernel families' adapters, which the declaration names (cmake/knobs.json ``adapter``):
FA2 and FA3 over their compiled modules, and FA4 (its own folder: the adapter, the kernel
cache, the dependency check and the precompile plan).
"""
