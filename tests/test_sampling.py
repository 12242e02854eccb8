"""Sampler invariants: greedy = teacher-forced argmax, cached log-probs = full-forward log-probs,
continuation through the cache = re-running from scratch, sharded = single device, stop
handling, and no recompilation within a bucket. The tiny preset everywhere except the
transformers parity test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import decode
from spade_jax import kv_cache
from spade_jax import loading
from spade_jax import logprobs
from spade_jax import model as model_lib
from spade_jax import sampling
from spade_jax import sharding

SAMPLED = sampling.Settings(max_new_tokens=10, temperature=0.8, top_k=40, top_p=0.9)


@pytest.fixture(scope="module")
def tiny():
  return loading.load_model("random:tiny", seed=3)


def _sampler(loaded, mesh=None, **kw):
  mesh = mesh or sharding.make_mesh({"data": -1}, jax.devices()[:1])
  return sampling.Sampler(loaded.cfg, mesh, **kw)


def _prompts(lengths, seed=0, vocab=256):
  rng = np.random.default_rng(seed)
  return [rng.integers(2, vocab, n).tolist() for n in lengths]


def _full_forward_check(loaded, prompts, out, temperature):
  """Each sampled row against one uncached forward over prompt + completion."""
  for p, toks, lp in zip(prompts, out.token_lists(), out.logprobs):
    seq = jnp.asarray([p + toks])
    logits = model_lib.forward(loaded.params, seq, loaded.cfg)[:, len(p) - 1:-1]
    want = logprobs.token_logprobs(logits, seq[:, len(p):], jnp.asarray([temperature]))
    np.testing.assert_allclose(lp[:len(toks)], want[0], atol=1e-5, rtol=0)
    if temperature == 0:
      np.testing.assert_array_equal(toks, np.asarray(jnp.argmax(logits[0], -1)))


def test_greedy_is_teacher_forced_argmax_and_logprobs_match(tiny):
  prompts = _prompts([5, 17, 1, 30])
  out = _sampler(tiny).generate(tiny.params, prompts, sampling.Settings(12, 0.0, 0, 1.0), seed=0)
  assert (out.lengths == 12).all() and out.finish_reasons() == ["length"] * 4
  _full_forward_check(tiny, prompts, out, 0.0)


def test_sampled_logprobs_match_full_forward_at_the_row_temperature(tiny):
  prompts = _prompts([9, 3, 20])
  out = _sampler(tiny).generate(tiny.params, prompts, SAMPLED, seed=7)
  _full_forward_check(tiny, prompts, out, SAMPLED.temperature)
  again = _sampler(tiny).generate(tiny.params, prompts, SAMPLED, seed=7)
  np.testing.assert_array_equal(out.tokens, again.tokens)  # reproducible from the seed


def test_samples_share_a_prefill_and_differ(tiny):
  prompts = _prompts([6, 11])
  out = _sampler(tiny).generate(tiny.params, prompts, SAMPLED, seed=1, num_samples=4)
  assert out.tokens.shape == (8, SAMPLED.max_new_tokens)
  assert len({tuple(t) for t in out.token_lists()[:4]}) > 1
  _full_forward_check(tiny, [p for p in prompts for _ in range(4)], out, SAMPLED.temperature)
  greedy = _sampler(tiny).generate(tiny.params, prompts, sampling.Settings(6, 0.0, 0, 1.0), 0,
                                   num_samples=3)
  assert all(greedy.token_lists()[i] == greedy.token_lists()[0] for i in range(3))


def test_stop_reasons(tiny):
  prompts = _prompts([4, 8, 12])
  settings = sampling.Settings(8, 0.0, 0, 1.0)
  free = _sampler(tiny).generate(tiny.params, prompts, settings, 0)
  eos, stop = int(free.tokens[0, 2]), int(free.tokens[1, 4])
  out = _sampler(tiny, eos_ids=(eos,), stop_ids=(stop,)).generate(tiny.params, prompts, settings,
                                                                   0)
  toks = out.token_lists()
  for row, reason in enumerate(out.finish_reasons()):
    cut = next((i for i, t in enumerate(free.tokens[row]) if t in (eos, stop)), None)
    if cut is None:
      assert reason == "length" and toks[row] == free.token_lists()[row]
    else:
      assert toks[row] == free.token_lists()[row][:cut + 1]
      assert reason == ("eos" if free.tokens[row, cut] == eos else "stop")
  assert out.finish_reasons()[0] == "eos"
  ignored = _sampler(tiny, eos_ids=(eos,)).generate(
      tiny.params, prompts, sampling.Settings(8, 0.0, 0, 1.0, ignore_eos=True), 0)
  assert (ignored.lengths == 8).all()


def test_three_turn_continuation_equals_running_from_scratch(tiny):
  """Turn t through the cache == sampling from the whole transcript so far, same seed; one
  conversation ends after the first turn and is compacted away."""
  sampler = _sampler(tiny, stop_ids=(7,))
  prompts = _prompts([6, 13, 3, 9], seed=5)
  observations = [_prompts([4, 1, 9, 2], seed=11), _prompts([2, 7, 1, 5], seed=12)]
  conv, out = sampler.start(tiny.params, prompts, SAMPLED, seed=100)
  transcripts = [p + t for p, t in zip(prompts, out.token_lists())]
  for turn, obs in enumerate(observations, start=1):
    new = [o if i != 2 else None for i, o in enumerate(obs)]
    conv, out = sampler.extend(tiny.params, conv, new, SAMPLED, seed=100 + turn)
    transcripts = [t + o for t, o in zip(transcripts, obs)]
    scratch = sampler.generate(tiny.params, transcripts, SAMPLED, seed=100 + turn)
    for i in (0, 1, 3):
      assert out.token_lists()[i] == scratch.token_lists()[i]
      np.testing.assert_allclose(out.logprobs[i], scratch.logprobs[i], atol=1e-5, rtol=0)
      assert out.finish_reasons()[i] == scratch.finish_reasons()[i]
    assert out.lengths[2] == 0 and out.finish_reasons()[2] == "none"
    transcripts = [t + k for t, k in zip(transcripts, out.token_lists())]
  with pytest.raises(ValueError, match="ended"):
    sampler.extend(tiny.params, conv, [[1]] * 4, SAMPLED, seed=0)


def test_cache_capacity_does_not_change_results(tiny):
  """A prompt cache fanned out into a large capacity, and a conversation compacted from it into a
  smaller one, give the tokens and log-probs of the smallest fitting capacity (the live slots
  span two attention blocks)."""
  sampler = _sampler(tiny)
  prompts, obs = _prompts([70, 13, 3], seed=8), _prompts([4, 9, 2], seed=9)
  small_conv, small = sampler.start(tiny.params, prompts, SAMPLED, seed=4)
  big_conv, big = sampler.start(tiny.params, prompts, SAMPLED, seed=4, capacity=512)
  assert big_conv.cache.valid_BS.shape[1] == 512 > small_conv.cache.valid_BS.shape[1]
  np.testing.assert_array_equal(small.tokens, big.tokens)
  np.testing.assert_allclose(small.logprobs, big.logprobs, atol=1e-5, rtol=0)
  _, small = sampler.extend(tiny.params, small_conv, obs, SAMPLED, seed=5)
  shrunk_conv, shrunk = sampler.extend(tiny.params, big_conv, obs, SAMPLED, seed=5)
  assert shrunk_conv.cache.valid_BS.shape[1] < 512
  np.testing.assert_array_equal(small.tokens, shrunk.tokens)
  np.testing.assert_allclose(small.logprobs, shrunk.logprobs, atol=1e-5, rtol=0)


def test_one_pass_decode_attention_equals_the_block_loop(monkeypatch):
  """The GPU decode path (one masked pass over the whole cache) against the CPU block loop, with
  invalid slots inside the live prefix, live prefixes of different block counts, and an empty
  row (zeros)."""
  rng = np.random.default_rng(0)
  B, H, K, S, Dh = 3, 4, 2, 256, 16
  q = jnp.asarray(rng.normal(size=(B, 1, H, Dh)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(B, K, S, Dh)), jnp.float32) for _ in range(2))
  n_live = 150
  valid = rng.random((B, S)) < 0.8
  valid[:, n_live:] = False
  valid[2] = False
  valid = jnp.asarray(valid)
  slot_C = jnp.asarray([n_live - 1], jnp.int32)
  out = {}
  for one_pass in (False, True):
    monkeypatch.setattr(decode, "_one_pass_decode", lambda one_pass=one_pass: one_pass)
    assert decode._block(S, 1) == (S if one_pass else decode.DECODE_BLOCK)
    out[one_pass] = decode._attend(q, k, v, valid, slot_C, jnp.int32(n_live))
  np.testing.assert_allclose(out[True], out[False], atol=1e-6, rtol=0)
  np.testing.assert_array_equal(out[True][2], 0.0)
  assert float(jnp.abs(out[True][:2]).min()) > 0.0


def test_sharded_mesh_equals_single_device(tiny):
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  sharded = loading.load_model("random:tiny", mesh, seed=3)
  assert sharded.params["embed"].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  assert len(sharded.params["layers"]["wq"].addressable_shards) == 8
  np.testing.assert_array_equal(sharded.params["embed"], tiny.params["embed"])
  prompts = _prompts([5, 9, 2], seed=9)
  one = _sampler(tiny)
  many = _sampler(sharded, mesh)
  c1, o1 = one.start(tiny.params, prompts, SAMPLED, seed=4, num_samples=2)
  c8, o8 = many.start(sharded.params, prompts, SAMPLED, seed=4, num_samples=2)
  k_sh = c8.cache.k[0].sharding
  assert len(k_sh.device_set) == 8 and k_sh.spec[:2] == (("data", "fsdp"), "tensor")
  np.testing.assert_array_equal(o1.tokens, o8.tokens)
  np.testing.assert_allclose(o1.logprobs, o8.logprobs, atol=1e-5)
  obs = _prompts([3, 1, 4, 1, 5, 9], seed=2)
  _, o1 = one.extend(tiny.params, c1, obs, SAMPLED, seed=5)
  _, o8 = many.extend(sharded.params, c8, obs, SAMPLED, seed=5)
  np.testing.assert_array_equal(o1.tokens, o8.tokens)
  np.testing.assert_allclose(o1.logprobs, o8.logprobs, atol=1e-5)


def test_same_bucket_does_not_recompile(tiny):
  sampler = _sampler(tiny)
  sampler.generate(tiny.params, _prompts([20, 3]), SAMPLED, seed=0)
  programs = [sampling._empty, sampling._prefill, sampling._fan_out, sampling._decode,
              sampling._prepare]
  before = [p._cache_size() for p in programs]
  # Different lengths (same 32-token prompt bucket), batch (same bucket of 2) and seed.
  sampler.generate(tiny.params, _prompts([31], seed=4) + _prompts([17], seed=5), SAMPLED, seed=9)
  assert [p._cache_size() for p in programs] == before


def test_smollm2_greedy_matches_transformers(smollm2, smollm2_hf):
  """64 greedy tokens on 4 prompts (batched, left-padded on both sides), up to the first stop."""
  torch = pytest.importorskip("torch")
  tok = smollm2.tokenizer
  texts = ["The capital of France is", "def fibonacci(n):",
           "Here is a list of three fruits:", "In 1969, the first person to walk on the moon"]
  prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
  sampler = sampling.Sampler.for_model(smollm2)
  stops = set(sampler.eos_ids + sampler.stop_ids)
  out = sampler.generate(smollm2.params, prompts, sampling.Settings(64, 0.0, 0, 1.0), 0)
  T = max(len(p) for p in prompts)
  ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
  mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
  with torch.inference_mode():
    ref = smollm2_hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=64,
                              eos_token_id=sorted(stops), pad_token_id=0)[:, T:].tolist()
  for row, got in zip(ref, out.token_lists()):
    cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
    assert got == row[:cut]
  assert out.lengths.sum() >= 128  # most of the 4 x 64 tokens are really compared


@pytest.mark.parametrize("tied", [True, False])
def test_output_matrix_orientations_give_the_same_logits(tied):
  cfg = model_lib.PRESETS["tiny"].replace(tie_embeddings=tied)
  params = model_lib.init_params(cfg, jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (3, 2, cfg.d_model))
  a, b = (decode.prepare(params, cfg, vocab_major=m) for m in (False, True))
  assert b["head"].shape == (cfg.vocab_size, cfg.d_model)
  la = decode._logits(a["final_norm"], a["head"], x, cfg, False)
  lb = decode._logits(b["final_norm"], b["head"], x, cfg, True)
  np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_decode_step_matches_forward_in_both_weight_orientations(qkv_bias):
  """Prefill then one decode step through `prepare`'s weights gives the full forward's logits,
  with the output matrix either way round."""
  cfg = model_lib.PRESETS["tiny"].replace(qkv_bias=qkv_bias)
  params = model_lib.init_params(cfg, jax.random.key(0))
  if qkv_bias:  # non-zero biases, so that their path through the prepared weights is checked
    for i, n in enumerate(("bq", "bk", "bv")):
      params["layers"][n] = jax.random.normal(jax.random.key(7 + i), params["layers"][n].shape)
  tokens = jax.random.randint(jax.random.key(2), (2, 9), 0, cfg.vocab_size)
  want = model_lib.forward(params, tokens, cfg)[:, -1]
  cache = kv_cache.empty(cfg, 2, 16)
  _, cache = decode.prefill_chunk(params, cache, tokens[:, :-1], jnp.ones((2, 8), bool), cfg)
  for major in (False, True):
    w = decode.prepare(params, cfg, vocab_major=major)
    assert w["head"].shape == ((cfg.vocab_size, cfg.d_model) if major else
                               (cfg.d_model, cfg.vocab_size))
    got, _ = decode.decode_step(w, cache, tokens[:, -1], jnp.ones(2, bool), cfg)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
