"""FA4, upstream's CuTe DSL kernels shipped as ``vendored_flash_attn._fa4``: the adapter, the
shipped and user kernel caches, the check of its Python dependencies and the plan of the kernels
a build precompiles.
"""
