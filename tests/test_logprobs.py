"""The shared log-prob convention: full-vocabulary log_softmax at the row's temperature."""

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax import logprobs


def test_matches_hand_computed_log_softmax():
  logits = jnp.array([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])  # [1, 2, 3]
  tokens = jnp.array([[2, 1]])
  got = logprobs.token_logprobs(logits, tokens, jnp.array([0.5]))
  z = np.array([2.0, 4.0, 6.0])  # logits / T
  want0 = 6.0 - np.log(np.exp(z).sum())
  np.testing.assert_allclose(got, [[want0, -np.log(3.0)]], rtol=1e-5)


def test_greedy_rows_score_at_temperature_one():
  logits = jax.random.normal(jax.random.key(0), (2, 3, 7))
  tokens = jnp.argmax(logits, -1)
  got = logprobs.token_logprobs(logits, tokens, jnp.array([0.0, 1.0]))
  want = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(got, want, rtol=1e-6)
