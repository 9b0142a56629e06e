"""The call path, below the public calls (interface.py, sparse.py): each call's declared
arguments and how they reach the op (arguments), the checks of a call's tensors and options
(validation, and the opt-in device-side debug_checks), and FA3's scheduler metadata.
"""
