"""A study as stored: its storage, what it records, its resume checks, the recovery of trials a dead
process left running, the outcome of each trial and the study's summary. Never imports an engine."""
