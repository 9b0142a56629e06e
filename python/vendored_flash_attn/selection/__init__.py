"""What the runtime sees and picks: the environment (GPUs, compiled modules, build record),
the compiled modules and ops (compiled), the measured figures behind the defaults (measured,
reading the package root's measured.json) and the selector of a family for a call.
"""
