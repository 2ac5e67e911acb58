"""The inductor engine: PyTorch's ``torch.compile`` on the program a ``.pt2`` model holds. Its
description (``description``) and what its export ships (``deployment``) import none of the engine
a worker runs (``backend``)."""
