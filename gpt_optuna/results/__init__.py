"""Reading a study's outcome: the summary in words, the report, the winner recorded for Optuna's tools,
export and Triton."""
