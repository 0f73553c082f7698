"""The library's JAX primitives, each with all of its rules in one module."""
