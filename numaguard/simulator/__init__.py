"""The simulator: fake host roots (and, later, fake NVML and a fake cluster).

One module used by the tests, the demo and the benchmarks, so every fake behaves the
same way everywhere.
"""
