"""What runs in a worker process: the jobs (discover the space, build, check accuracy, time a
candidate, re-measure finalists), the latency protocol, and the worker process itself with its
deadline, crash and hang detection."""
