"""One compile unit's run: the wrapper ninja puts in front of each compile (compile_unit), its
output sorted (compiler_output), the processes it looks at (ninja_processes, proc) and the kinds
of unit the build declares (kinds). The compiler cache and the cluster run inside it; the
progress display reads what it records."""
