"""Logit parity with transformers for tiny random Llama / Qwen2 / Qwen3 models, and export."""

import functools
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

torch = pytest.importorskip("torch")

from spade_jax import attention as attention_lib  # noqa: E402
from spade_jax import hf, loading, model  # noqa: E402
from tests import hf_models  # noqa: E402

TOKENS = np.random.default_rng(0).integers(0, 97, size=(2, 11)).astype(np.int32)


@pytest.fixture(scope="module", params=sorted(hf_models.CONFIGS))
def saved(request, tmp_path_factory):
  m = hf_models.build(request.param)
  d = tmp_path_factory.mktemp(request.param)
  m.save_pretrained(d, safe_serialization=True)
  return request.param, m, str(d)


def test_logits_match_transformers(saved):
  name, m, d = saved
  loaded = loading.load_model(d, tokenizer=False)
  assert loaded.cfg.tie_embeddings == m.config.tie_word_embeddings
  ours = np.asarray(model.forward(loaded.params, jnp.asarray(TOKENS), loaded.cfg))
  ref = hf_models.logits(m, TOKENS)
  assert np.abs(ours - ref).max() < 1e-4, name


def test_padded_batch_matches_unpadded(saved):
  """Left padding with shifted positions and a key mask gives the unpadded logits."""
  _, _, d = saved
  loaded = loading.load_model(d, tokenizer=False)
  ref = np.asarray(model.forward(loaded.params, jnp.asarray(TOKENS[:1, 3:]), loaded.cfg))
  padded = TOKENS[:1].copy()
  padded[:, :3] = 0
  valid = np.arange(11)[None] >= 3
  positions = np.maximum(np.arange(11)[None] - 3, 0)
  out = model.forward(loaded.params, jnp.asarray(padded), loaded.cfg, jnp.asarray(positions),
                      model.default_mask(11, jnp.asarray(valid)))
  np.testing.assert_allclose(np.asarray(out)[:, 3:], ref, atol=1e-5)


def test_export_round_trip(saved, tmp_path):
  """ours -> HF directory -> transformers loads it -> same logits as ours."""
  import transformers

  name, _, d = saved
  loaded = loading.load_model(d, tokenizer=False)
  out = tmp_path / "export"
  hf.export(str(out), loaded.cfg, loaded.params)
  back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  ours = np.asarray(model.forward(loaded.params, jnp.asarray(TOKENS), loaded.cfg))
  assert np.abs(hf_models.logits(back, TOKENS) - ours).max() < 1e-4, name
  again = loading.load_model(str(out), tokenizer=False)
  for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bfloat16_compute_is_close():
  cfg = model.PRESETS["tiny"]
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(TOKENS % cfg.vocab_size)
  f32 = model.forward(params, tokens, cfg)
  bf16 = model.forward(params, tokens, cfg.replace(dtype="bfloat16"))
  assert bf16.dtype == jnp.float32  # logits always float32
  assert jax.tree.leaves(params)[0].dtype == jnp.float32  # master params untouched
  assert float(jnp.abs(f32 - bf16).max()) < 0.1


@pytest.mark.parametrize("n_in", [1, 2])
def test_dense_gradients_match_autodiff_of_einsum(n_in):
  kx, kw, kd = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(kx, (2, 5, 3, 4) if n_in == 2 else (2, 5, 12))
  w = jax.random.normal(kw, (3, 4, 7) if n_in == 2 else (12, 2, 7))
  spec = "btij,ijo->bto" if n_in == 2 else "btd,dho->btho"
  dy = jax.random.normal(kd, jnp.einsum(spec, x, w).shape)
  ours = jax.vjp(lambda x, w: model.dense(x, w, n_in), x, w)
  ref = jax.vjp(lambda x, w: jnp.einsum(spec, x, w), x, w)
  np.testing.assert_allclose(ours[0], ref[0], atol=1e-5)
  for a, b in zip(ours[1](dy), ref[1](dy)):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("rows", [64, 37])
def test_bfloat16_dense_products_stay_bfloat16_and_match_float32(rows):
  """With compute dtype bfloat16, dense's product and both backward products take bfloat16
  operands (float32 accumulation) in the compiled program: on CPU, XLA runs any bfloat16 product
  it has no fast kernel for in float32 instead, silently, and a transposed operand is such a
  case. Results and gradients stay within bfloat16 rounding of the float32 ones."""
  kx, kw, kd = jax.random.split(jax.random.key(5), 3)
  x = jax.random.normal(kx, (rows, 96))
  w = jax.random.normal(kw, (96, 160)) / 10
  dy = jax.random.normal(kd, (rows, 160))

  def vjp(x, w, dtype):
    y, pull = jax.vjp(lambda x, w: model.dense(x, w, 1, dtype), x, w)
    return (y, *pull(dy))

  got = jax.jit(functools.partial(vjp, dtype="bfloat16"))
  for a, b in zip(got(x, w), vjp(x, w, None)):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=0.05, atol=0.05 * float(jnp.abs(b).max()))
  if jax.devices()[0].platform != "cpu":
    return
  hlo = got.lower(x, w).compile().as_text()
  dtype_of = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", hlo))
  dots = re.findall(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", hlo)
  assert len(dots) == 3, hlo
  assert all(dtype_of[a] == dtype_of[b] == "bf16" for a, b in dots), dots


def _reference_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS):
  """Per-head softmax attention written the plain way (kv heads repeated), for autodiff."""
  G = q_BTHD.shape[2] // k_BSKD.shape[2]
  k, v = (jnp.repeat(a, G, axis=2) for a in (k_BSKD, v_BSKD))
  s = jnp.einsum("bthd,bshd->bhts", q_BTHD, k) * q_BTHD.shape[-1] ** -0.5
  visible = mask_BTS[:, None]
  p = jax.nn.softmax(jnp.where(visible, s, -1e30), axis=-1) * visible.any(-1, keepdims=True)
  return jnp.einsum("bhts,bshd->bthd", p, v)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_matches_autodiff_of_the_plain_softmax(causal, monkeypatch):
  """The hand-written backward (probabilities rebuilt from the saved log-sum-exp) against
  autodiff of the textbook formula: causal, padded keys, and a query row that sees nothing; with
  `causal`, in query blocks of 3, 3 and 1 that each skip the keys after their end."""
  monkeypatch.setattr(attention_lib, "causal_spans",
                      functools.partial(attention_lib.causal_spans, max_blocks=3, min_block=2))
  rng = np.random.default_rng(0)
  B, T, H, K, Dh = 2, 7, 6, 2, 8
  q = jnp.asarray(rng.normal(size=(B, T, H, Dh)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(B, T, K, Dh)), jnp.float32) for _ in range(2))
  mask = np.tril(np.ones((T, T), bool))[None].repeat(B, 0)
  mask[1, :, :2] = False  # two padded keys
  mask[1, 0] = False  # a query that sees nothing
  mask = jnp.asarray(mask)
  w = jnp.asarray(rng.normal(size=(B, T, H, Dh)), jnp.float32)
  ours = lambda *a: jnp.sum(attention_lib.attention(*a, mask, causal=causal) * w)
  ref = lambda *a: jnp.sum(_reference_attention(*a, mask) * w)
  np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), rtol=1e-6)
  np.testing.assert_array_equal(attention_lib.attention(q, k, v, mask, causal=causal)[1, 0], 0.0)
  for g, g_ref in zip(jax.grad(ours, (0, 1, 2))(q, k, v), jax.grad(ref, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g, g_ref, atol=2e-6, rtol=1e-5)


def test_causal_spans_cover_the_queries_in_bounded_blocks():
  assert attention_lib.causal_spans(256) == (
      (0, 64, 64), (64, 128, 128), (128, 192, 192), (192, 256, 256))
  assert attention_lib.causal_spans(40) == ((0, 40, 40),)
  spans = attention_lib.causal_spans(4097)
  assert len(spans) == 8 and spans[0] == (0, 513, 513) and spans[-1] == (3591, 4097, 4097)
  # Queries at key positions 100..227 (a continuation after a 100-token prefix).
  assert attention_lib.causal_spans(128, 100) == ((0, 64, 164), (64, 128, 228))


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_swiglu_down_backward_matches_autodiff(dtype):
  """The fused MLP output (its backward recomputes silu(gate) * up) against autodiff of the
  unfused composition, in float32 and with bfloat16 products; gates wide enough to reach both
  tails of the sigmoid."""
  kg, ku, kw, kd = jax.random.split(jax.random.key(6), 4)
  gate, up = 3 * jax.random.normal(kg, (5, 7)), jax.random.normal(ku, (5, 7))
  w_down, dy = 0.3 * jax.random.normal(kw, (7, 4)), jax.random.normal(kd, (5, 4))
  fused = lambda g, u, w: jnp.sum(model.swiglu_down(g, u, w, dtype) * dy)
  plain = lambda g, u, w: jnp.sum(model.dense(jax.nn.silu(g) * u, w, 1, dtype) * dy)
  np.testing.assert_allclose(fused(gate, up, w_down), plain(gate, up, w_down), rtol=1e-6)
  for a, b in zip(jax.grad(fused, (0, 1, 2))(gate, up, w_down),
                  jax.grad(plain, (0, 1, 2))(gate, up, w_down)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_norm_dense_backward_matches_autodiff(dtype):
  """The pre-norm projections (the norm recomputed in the backward pass) against autodiff of
  rms_norm followed by each product, in float32 and with bfloat16 products."""
  kx, kn, kw, kd = jax.random.split(jax.random.key(7), 4)
  x, norm_w = 2 * jax.random.normal(kx, (2, 3, 8)), 1 + 0.1 * jax.random.normal(kn, (8,))
  ws = (0.3 * jax.random.normal(kw, (8, 2, 4)), 0.3 * jax.random.normal(kd, (8, 5)))
  dys = (jax.random.normal(kd, (2, 3, 2, 4)), jax.random.normal(kw, (2, 3, 5)))
  loss = lambda outs: sum(jnp.sum(o * d) for o, d in zip(outs, dys))
  fused = lambda x, n, ws: loss(model.norm_dense(x, n, ws, 1e-5, dtype))
  plain = lambda x, n, ws: loss(tuple(model.dense(model.rms_norm(x, n, 1e-5), w, 1, dtype)
                                      for w in ws))
  np.testing.assert_allclose(fused(x, norm_w, ws), plain(x, norm_w, ws), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(jax.grad(fused, (0, 1, 2))(x, norm_w, ws)),
                  jax.tree.leaves(jax.grad(plain, (0, 1, 2))(x, norm_w, ws))):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)

