"""Shared prompt prefixes: the split `find` picks, the forward pass that runs each prefix once
(same hidden states and gradients as row by row), and the learner step with and without it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import attention as attention_lib
from spade_jax import learner as learner_lib
from spade_jax import model as model_lib
from spade_jax import prefix, sharding
from tests.test_learner import CFG, assert_same_step, fresh, one_device_mesh

B, T = 8, 64


def grouped_tokens(seed=0, shared=(40, 40, 40, 40, 37, 37, 37, 37)):
  """Rows 0-3 share their first 40 tokens, rows 4-7 their first 37."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  for b, n in enumerate(shared):
    tokens[b, :n] = tokens[b // 4 * 4, :n]
  return tokens


def test_find_picks_the_cheapest_split_and_groups_rows():
  split = prefix.find(grouped_tokens())
  assert split.tokens_UP.shape == (2, 32)  # split points 32, 48: 48 is past group 2's prompt
  assert list(split.slot_B) == [0] * 4 + [1] * 4 or list(split.slot_B) == [1] * 4 + [0] * 4
  tokens = grouped_tokens()
  np.testing.assert_array_equal(split.tokens_UP[split.slot_B], tokens[:, :32])
  # Slots padded to the shard multiple with copies of the first prefix (no row points at them).
  padded = prefix.find(tokens, slot_multiple=3)
  assert padded.tokens_UP.shape == (3, 32) and padded.slot_B.max() == 1
  np.testing.assert_array_equal(padded.tokens_UP[2], padded.tokens_UP[0])


def test_find_declines_when_rows_share_too_little():
  rng = np.random.default_rng(1)
  assert prefix.find(rng.integers(0, 256, (B, T))) is None  # nothing shared
  pairs = grouped_tokens(shared=(40,) * 2 + (0,) * 6)  # rows 0-1 only: saves 32 of 512
  assert prefix.find(pairs, min_saving=0.1) is None
  assert prefix.find(pairs).tokens_UP.shape == (7, 32)  # saves 6.25% >= the default 5%
  assert prefix.split_points(256) == [32, 48, 64, 96, 128, 192]


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_find_on_random_groups_is_consistent_and_minimal(parts):
  """Random group sizes and shared lengths: every row begins with its slot's prefix, and each
  micro-batch's prefixes are exactly its distinct rows' first P tokens."""
  rng = np.random.default_rng(parts)
  for _ in range(20):
    tokens = rng.integers(0, 5, (B, T)).astype(np.int32)  # a small vocabulary: chance overlaps
    for b in range(1, B):
      if rng.random() < 0.7:
        src, n = rng.integers(0, b), rng.integers(0, T)
        tokens[b, :n] = tokens[src, :n]
    split = prefix.find(tokens, parts, min_saving=0.0)
    if split is None:
      continue
    prefix.check(tokens, *split, parts=parts)
    P = split.tokens_UP.shape[1]
    U = max(len(np.unique(tokens[j::parts, :P], axis=0)) for j in range(parts))
    assert split.tokens_UP.shape[0] == U * parts


def test_micro_batches_get_their_own_prefixes():
  """Rows of one prompt scattered over the batch: the grouping order brings each prompt's rows
  into one of the two interleaved micro-batches (rows j, j + 2, ...), each with its own prefix."""
  tokens = grouped_tokens()[[0, 4, 1, 5, 6, 2, 3, 7]]
  order = prefix.grouping_order(tokens, 2)
  assert sorted(order) == list(range(B))
  assert all(len({tokens[order][b, :37].tobytes() for b in range(j, B, 2)}) == 1 for j in (0, 1))
  split = prefix.find(tokens[order], parts=2)
  assert split.tokens_UP.shape == (2, 32) and not split.slot_B.any()  # one prefix per micro-batch
  prefix.check(tokens[order], *split, parts=2)
  # Without the reordering each micro-batch holds both prompts: twice the prefixes.
  assert prefix.find(tokens, parts=2).tokens_UP.shape == (4, 32)
  with pytest.raises(ValueError, match="do not begin"):
    prefix.check(tokens, *split, parts=2)


def test_check_names_rows_that_do_not_begin_with_their_prefix():
  tokens = grouped_tokens()
  split = prefix.find(tokens)
  prefix.check(tokens, *split)
  tokens[5, 3] += 1
  with pytest.raises(ValueError, match=r"rows \[5\]"):
    prefix.check(tokens, *split)
  with pytest.raises(ValueError, match="slots must lie"):
    prefix.check(grouped_tokens(), split.tokens_UP, split.slot_B + 1)
  with pytest.raises(ValueError, match="do not fit"):
    prefix.check(grouped_tokens(), grouped_tokens(), split.slot_B)  # P == T


@pytest.mark.parametrize("remat", [False, True])
def test_hidden_states_and_gradients_equal_the_row_by_row_pass(remat, monkeypatch):
  """Each prefix run once, its keys and values gathered per row (small query blocks, so the
  continuations' offset causal spans are exercised), against the plain forward pass."""
  monkeypatch.setattr(attention_lib, "causal_spans",
                      functools.partial(attention_lib.causal_spans, max_blocks=3, min_block=4))
  params = model_lib.init_params(CFG, jax.random.key(2))
  tokens = jnp.asarray(grouped_tokens(3))
  split = prefix.find(tokens)
  w = jax.random.normal(jax.random.key(3), (B, T, CFG.d_model))
  plain = lambda p: jnp.sum(model_lib.hidden_states(p, tokens, CFG, remat=remat) * w)
  shared = lambda p: jnp.sum(prefix.hidden_states(
      p, tokens, jnp.asarray(split.tokens_UP), jnp.asarray(split.slot_B), CFG, remat) * w)
  np.testing.assert_allclose(
      prefix.hidden_states(params, tokens, *map(jnp.asarray, split), CFG),
      model_lib.hidden_states(params, tokens, CFG), rtol=1e-5, atol=1e-5)
  g_plain, g_shared = jax.grad(plain)(params), jax.grad(shared)(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_plain), jax.tree.leaves(g_shared)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * np.abs(a).max(),
                               err_msg=jax.tree_util.keystr(path))


def grouped_batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  mask[:, 30:] = (rng.random((B, T - 30)) > 0.2)  # trained tokens inside the prefix too
  return {
      "tokens_BT": grouped_tokens(seed),
      "loss_mask_BT": mask,
      "advantages_B": rng.normal(size=B).astype(np.float32),
      "logp_behaviour_BT": (-5.5 + 0.3 * rng.normal(size=(B, T))).astype(np.float32),
      "temperature_B": rng.choice([0.6, 1.0], size=B).astype(np.float32),
  }


SHARED = learner_lib.LearnerConfig()
UNSHARED = learner_lib.LearnerConfig(share_prefix=False)


def test_step_with_shared_prefixes_equals_the_unshared_step():
  batch = grouped_batch(4)
  assert "prefix_tokens_UP" in learner_lib.with_shared_prefixes(batch, SHARED)
  lrn, s_shared = fresh(one_device_mesh(), SHARED)
  s_shared, m_shared = lrn.train_step(s_shared, batch)
  lrn, s_plain = fresh(one_device_mesh(), UNSHARED)
  s_plain, m_plain = lrn.train_step(s_plain, batch)
  assert_same_step(s_plain, s_shared, 1e-6)
  # 2 prefixes of 32 and 8 continuations of 32 run, of 8 x 64 positions.
  assert m_plain["prefix_saving"] == 0 and m_shared["prefix_saving"] == 1 - (64 + 256) / 512
  for k in set(m_plain) - {"prefix_saving"}:
    np.testing.assert_allclose(m_shared[k], m_plain[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_shared_prefixes_on_a_222_mesh_equal_one_device():
  """Two prompts over 4 batch shards: the slots are padded to 4 and split over the shards."""
  batch = grouped_batch(5)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  assert learner_lib.with_shared_prefixes(batch, SHARED, 4)["prefix_tokens_UP"].shape == (4, 32)
  lrn1, s1 = fresh(one_device_mesh(), UNSHARED)
  s1, m1 = lrn1.train_step(s1, batch)
  lrn8, s8 = fresh(mesh, SHARED)
  s8, m8 = lrn8.train_step(s8, batch)
  assert_same_step(s1, s8, 1e-5)
  np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)


def test_micro_batched_step_with_shared_prefixes_equals_the_full_unshared_step():
  """Micro-batches of 4 rows, the two prompts' rows interleaved in the batch: reordered so that
  each micro-batch holds one prompt's rows, the step equals the plain full-batch step."""
  batch = {k: v[[0, 4, 1, 5, 6, 2, 3, 7]] for k, v in grouped_batch(6).items()}
  micro = learner_lib.LearnerConfig(micro_batch=4)
  shared = learner_lib.with_shared_prefixes(batch, micro)
  assert shared["prefix_tokens_UP"].shape == (2, 32)
  lrn, s_full = fresh(one_device_mesh(), UNSHARED)
  s_full, m_full = lrn.train_step(s_full, batch)
  lrn, s_micro = fresh(one_device_mesh(), micro)
  s_micro, m_micro = lrn.train_step(s_micro, batch)
  assert_same_step(s_full, s_micro, 1e-6)
  for k in set(m_full) - {"prefix_saving"}:
    np.testing.assert_allclose(m_micro[k], m_full[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_prefixes_that_do_not_fit_the_step_are_a_clear_error():
  batch = grouped_batch()
  split = prefix.find(batch["tokens_BT"])
  given = dict(batch, prefix_tokens_UP=split.tokens_UP, prefix_slot_B=split.slot_B)
  lrn, state = fresh(one_device_mesh(), learner_lib.LearnerConfig(minibatches=2))
  with pytest.raises(ValueError, match="minibatches 1"):
    lrn.train_step(state, given)
  lrn, state = fresh(one_device_mesh(), SHARED)
  with pytest.raises(ValueError, match="come together"):
    lrn.train_step(state, dict(batch, prefix_slot_B=split.slot_B))
  bad = dict(given, tokens_BT=given["tokens_BT"].copy())
  bad["tokens_BT"][2, 0] += 1
  with pytest.raises(ValueError, match=r"rows \[2\]"):
    lrn.train_step(state, bad)
  # Several optimizer steps per batch and left-padded rows score row by row: no prefixes added.
  assert "prefix_tokens_UP" not in learner_lib.with_shared_prefixes(
      batch, learner_lib.LearnerConfig(minibatches=2))
  assert "prefix_tokens_UP" not in learner_lib.with_shared_prefixes(
      dict(batch, valid_BT=np.ones((B, T), bool)), SHARED)
