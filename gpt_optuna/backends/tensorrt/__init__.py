"""TensorRT and TensorRT-RTX: their backend and the trtexec / Polygraphy command lines of a trial."""
