"""Shared multi-process harness of the sharding benches and their tests (not a bench itself)."""
