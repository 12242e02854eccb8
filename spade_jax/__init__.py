"""spade_jax: SPADE self-play (one model as environment designer and reasoning agent) in JAX."""
