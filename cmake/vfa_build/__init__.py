"""The Python that the build (cmake/*.cmake) runs, by concern; run through the entry point:
python -E -s -S <project>/cmake/vfa_build <module> [args] (see __main__.py)."""
