"""The benchmarks: scripts that print the figures in ``docs/``, run from the repository's root as
``python -m benchmarks.NAME`` (``README.md`` here says which script makes which figure)."""
