"""TensorRT and TensorRT-RTX: their backend and the trtexec / Polygraphy command lines of a trial.
Their descriptions (``description``) import none of the engine a worker runs (``backend``)."""
