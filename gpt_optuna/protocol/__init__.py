"""What the tuner and its worker processes share: the jobs it sends (each names the worker's code
that runs it), the results they send back, the accuracy criterion, the latency settings, and the
worker process itself with its deadline, crash and hang detection."""
