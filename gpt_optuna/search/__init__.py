"""The Optuna side, in the tuner's process: the configuration, the preparation of model and space,
sampling and seeds, the objective, lanes of workers, the search session shared by ``tune`` and
``worker``, and the finalists' re-measurement."""
