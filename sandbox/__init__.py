"""Host-side execution and verification of generated environments. Never imports JAX."""
