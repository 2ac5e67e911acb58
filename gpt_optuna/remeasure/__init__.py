"""The interleaved re-measurement of finalists: planned, run in fresh processes, and the study's
evaluation template it times them by."""
