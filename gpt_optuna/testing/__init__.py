"""Fixtures for the tests and benchmarks, never imported by the tuner: a synthetic backend, small
models, MobileNetV2 from its real weights, test data from the package registry."""
