"""The Optuna side, in the tuner's process: the configuration, the space's check, sampling and
seeds, warm starts, build routes, the objective and the lanes of workers (the use cases that run
them: :mod:`gpt_optuna.usecases`)."""
