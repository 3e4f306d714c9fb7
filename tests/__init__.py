"""The test suite (`make check`: not slow; `make test`: all) and its helpers, tiers and fixtures.

The top floor, beside `bench`: may import every other folder.
"""
