"""FA4's build steps: probe, stage, plan, precompile over workers, share across Pythons (precompile.py is the command line)."""
