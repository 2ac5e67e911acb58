"""The vocabulary every layer shares: errors and exit codes, signals that are never lost, and the
search space's knobs and candidates."""
