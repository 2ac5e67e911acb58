"""ONNX Runtime: its backend, the knobs it offers, the session settings a candidate maps to, and
``open_session`` for an exported model. Its description (``description``) imports none of the
engine a worker runs (``backend``)."""
