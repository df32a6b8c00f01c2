"""JAX settings for ``mbi``, applied before it is imported (every module here that imports
``mbi`` imports this first)."""

import jax

# Private-PGM's estimates stall in float32 on large totals (its own warning): JAX in float64.
jax.config.update("jax_enable_x64", True)
# mbi compiles many small programs: a persistent cache only costs disk (its own advice).
jax.config.update("jax_enable_compilation_cache", False)
