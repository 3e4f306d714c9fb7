"""What the tests and the benchmarks share: loopback servers, generated inputs, multi-process step runners.

May import config, charts, stacks, tools, workloads; never tests or bench (tests/test_imports.py), so a benchmark
measures the same code a test checks without either depending on the other.
"""
