"""Logit parity with transformers for tiny random Llama / Qwen2 / Qwen3 models, and export."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

torch = pytest.importorskip("torch")

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
