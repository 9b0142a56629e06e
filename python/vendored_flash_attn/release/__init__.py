"""The release checks of a built wheel or an installed package (``python -m
vendored_flash_attn.release.wheel_check``): its build record against the declaration and the
pin, its compiled modules (abi3, C++ runtime, size) and FA4's shipped kernels.
"""
