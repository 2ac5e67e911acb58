"""What runs in a worker process only: each job's work (discover the space, build, check accuracy,
time a candidate, re-measure finalists, profile, self-test, the reference outputs) and the latency
protocol. The tuner reaches it only through the jobs of :mod:`gpt_optuna.protocol`."""
