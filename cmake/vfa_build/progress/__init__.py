"""The build's progress: the per-unit compile launcher, the monitor and its estimate, compiler output, ninja's processes."""
