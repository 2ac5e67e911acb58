"""The use cases, each a script of named steps: tune (its preparation, progress, session and time
budget), join, check, compare and profile."""
