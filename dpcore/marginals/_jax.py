"""JAX settings for ``mbi``, applied before it is imported (every module here that imports
``mbi`` imports this first)."""

import os

# A fit's time is its XLA compilation (AIM compiles a new program every round; the compiled
# steps themselves are short): compile with LLVM's cheaper passes unless the operator set flags.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
)

import jax

# Private-PGM's estimates stall in float32 on large totals (its own warning): JAX in float64.
jax.config.update("jax_enable_x64", True)
# mbi compiles many small programs: a persistent cache only costs disk (its own advice).
jax.config.update("jax_enable_compilation_cache", False)
