"""Benchmarks that print the figures docs/benchmarks.md quotes (`make bench`; some by hand).

The top floor, beside `tests`: may import every other folder.
"""
