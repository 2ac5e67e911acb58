"""The Python API: tune, load and read a study, confirm, export, check (see docs/api.md)."""
