"""The build's progress display: the monitor in ninja's console pool and its estimate of what is left (it reads what each unit's run records: cmake/vfa_build/units)."""
