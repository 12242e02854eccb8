"""google/tunix's sampler as a peer for `bench sampler --compare_tunix` (optional dependency).

Tunix's Llama3 model is loaded from the very parameters our sampler uses (exported to a
transformers-style safetensors directory, the format tunix reads), on a one-device mesh, float32
or bfloat16 as asked. Tunix's sampler takes text; a fixed-table tokenizer hands it our prompt
token ids unchanged (no BOS added, left-padded with id 0, which the prompts never use), so both
samplers see the same tokens. Every row must generate the asked number of tokens: tunix has no
"ignore EOS" switch, so a row that stops early fails the comparison rather than flattering it.

Install: `pip install --no-deps -r requirements-peer.txt` (exact pins, next to our own).
"""

from __future__ import annotations

import tempfile
import time

import jax
import numpy as np

from spade_jax import hf
from spade_jax import sampling

PAD = 0  # never a prompt token (bench prompts draw ids from 100 up)


class _FixedTokenizer:
  """Tunix's tokenizer interface over a table: the text "i" encodes to prompt row i."""

  def __init__(self, rows: list[list[int]], eos: int):
    self.rows, self.eos = rows, eos

  def encode(self, text: str, **_) -> list[int]:
    return list(self.rows[int(text)])

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self) -> int:
    return 0  # falsy: tunix then prepends nothing

  def eos_id(self) -> int:
    return self.eos

  def pad_id(self) -> int:
    return PAD


def _import_tunix():
  try:
    from tunix.generate import sampler as tunix_sampler
    from tunix.models.llama3 import model as tunix_llama
    from tunix.models.llama3 import params as tunix_params
  except ImportError as e:
    raise SystemExit("--compare_tunix needs google/tunix: pip install --no-deps -r "
                     f"requirements-peer.txt ({e})") from e
  return tunix_sampler, tunix_llama, tunix_params


class TunixPeer:
  """Tunix's sampler over our loaded model; `tokens_per_s` times one batch like our bench."""

  def __init__(self, loaded, dtype: str):
    cfg = loaded.cfg
    if cfg.family != "llama" or cfg.qkv_bias:
      raise SystemExit(f"--compare_tunix supports llama-family models; {cfg.family} given")
    tunix_sampler, tunix_llama, tunix_params = _import_tunix()
    tcfg = tunix_llama.ModelConfig(
        num_layers=cfg.n_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.d_model,
        hidden_dim=cfg.d_ff, num_heads=cfg.n_heads, head_dim=cfg.head_dim,
        num_kv_heads=cfg.n_kv_heads, rope_theta=cfg.rope_theta, norm_eps=cfg.norm_eps,
        weight_tying=cfg.tie_embeddings)
    self.mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    with tempfile.TemporaryDirectory() as d, self.mesh:
      hf.export(d, cfg, loaded.params)
      model = tunix_params.create_model_from_safe_tensors(d, tcfg, mesh=self.mesh,
                                                          dtype=np.dtype(dtype))
    self._make = lambda tok, capacity: tunix_sampler.Sampler(model, tok, tunix_sampler.CacheConfig(
        cache_size=capacity, num_layers=cfg.n_layers, num_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim))
    self.vocab = cfg.vocab_size

  def tokens_per_s(self, prompts: np.ndarray, settings: sampling.Settings, capacity: int,
                   repeats: int) -> float:
    B, P = prompts.shape
    n = settings.max_new_tokens
    # EOS: an id outside the vocabulary, so no row stops early (the bench's "ignore EOS").
    sampler = self._make(_FixedTokenizer(prompts.tolist(), eos=self.vocab), capacity)
    kw = dict(max_generation_steps=n, max_prompt_length=P, temperature=settings.temperature,
              top_p=settings.top_p, top_k=settings.top_k, eos_tokens=[self.vocab])
    texts = [str(i) for i in range(B)]
    best = float("inf")
    for r in range(repeats + 1):  # the first call compiles
      t = time.perf_counter()
      with self.mesh:
        out = sampler(texts, seed=r, **kw)
      if r:
        best = min(best, time.perf_counter() - t)
    lengths = [len(t) for t in out.tokens]
    if lengths != [n] * B:
      raise RuntimeError(f"tunix generated {lengths} tokens per row, not {n}")
    return B * n / best
