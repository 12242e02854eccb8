"""The one generation interface every benchmark uses: chat prompts + sampling in, text out.

A `Generator` maps a batch of `Prompt`s (chat messages, plus the reference answer the benchmark
would accept) and one `Sampling` to `n` completions per prompt. Three implementations:

  * `ModelGenerator(spec)`: any `--model` SPEC the generate CLI accepts, sampled with
    `spade_jax.sampling.Sampler` (all device work lives there; `_sample` is the only place
    that talks to it);
  * `oracle`: answers every prompt with its reference (gold answer, reference program, scripted
    tool calls) — a benchmark whose oracle does not score 1.0 has a grading bug;
  * `empty`: answers "" — a benchmark whose empty answer scores above 0.0 has a grading bug.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

Message = dict[str, str]


@dataclasses.dataclass(frozen=True)
class Prompt:
  messages: tuple[Message, ...]
  oracle: str = ""  # what the `oracle` generator answers


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How to sample one benchmark. temperature 0 = greedy; top_k 0 / top_p 1 switch cuts off."""

  n: int = 1  # completions per prompt
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 256
  seed: int = 0
  max_prompt_tokens: int = 0  # longer prompts are not sampled (answer ""); 0: the model's context

  def __post_init__(self):
    if self.n < 1 or self.max_new_tokens < 1:
      raise ValueError(f"n and max_new_tokens must be positive: {self}")
    if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
      raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1: {self}")


class OracleGenerator:
  name = "oracle"

  def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[str]]:
    return [[p.oracle] * sampling.n for p in prompts]


class EmptyGenerator:
  name = "empty"

  def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[str]]:
    return [[""] * sampling.n for _ in prompts]


class ModelGenerator:
  """Chat prompts rendered with the model's own template and sampled with our sampler.

  A prompt longer than the model's context (or than `Sampling.max_prompt_tokens`) is not
  sampled: its completions are "" and it is counted in `overflows` (reported per benchmark)
  instead of aborting the whole evaluation.
  Completions that hit `max_new_tokens` are counted in `truncated`.
  """

  def __init__(self, spec: str, dtype: str = "float32", max_rows: int = 16,
               tokenizer: str | None = None):
    from spade_jax import checkpoint, loading, sampling
    from spade_jax import tokenizer as tok_lib

    self.name = spec
    self.loaded = loading.load_model(spec, dtype=dtype, tokenizer=tokenizer is None)
    if tokenizer is not None:  # another SPEC's tokenizer (random:* weights have none)
      self.loaded.tokenizer = tok_lib.load_tokenizer(checkpoint.tokenizer_path(tokenizer))
    if self.loaded.tokenizer is None:
      raise ValueError(f"model {spec!r} has no tokenizer; benchmarks need chat prompts "
                       "(--tokenizer SPEC)")
    self.sampler = sampling.Sampler.for_model(self.loaded)
    self.max_rows = max_rows  # sequences decoded together (prompts x samples)
    self.overflows = 0
    self.truncated = 0
    self.tokens_out = 0
    self.device_s = 0.0
    self._calls = 0
    self._capacity = 0

  def _encode(self, prompt: Prompt) -> list[int]:
    from spade_jax import tokenizer as tok_lib

    tok = self.loaded.tokenizer
    return tok_lib.encode(tok, tok_lib.render(tok, list(prompt.messages)))

  def _sample(self, token_lists: list[list[int]], sampling: Sampling, max_new: int,
              seed: int) -> list[list[tuple[list[int], str]]]:
    """The adapter to spade_jax.sampling: (tokens, finish reason) per prompt, per sample."""
    from spade_jax import sampling as sampling_lib

    from spade_jax import kv_cache

    settings = sampling_lib.Settings(max_new_tokens=max_new, temperature=sampling.temperature,
                                     top_k=sampling.top_k, top_p=sampling.top_p)
    # The cache capacity only grows during a run: the decode program is compiled per capacity,
    # and on CPU a compile costs more than decoding a benchmark's prompts at a larger capacity.
    need = max(len(t) for t in token_lists) + max_new
    self._capacity = max(self._capacity, kv_cache.bucket(need, self.sampler.min_capacity))
    out = self.sampler.generate(self.loaded.params, token_lists, settings, seed,
                                num_samples=sampling.n, capacity=self._capacity)
    rows = list(zip(out.token_lists(), out.finish_reasons()))
    return [rows[i * sampling.n:(i + 1) * sampling.n] for i in range(len(token_lists))]

  def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[str]]:
    tok = self.loaded.tokenizer
    stops = set(self.sampler.eos_ids) | set(self.sampler.stop_ids)
    limit = self.loaded.cfg.max_seq_len
    longest_ok = min(limit - 1, sampling.max_prompt_tokens or limit)
    encoded = [self._encode(p) for p in prompts]
    results: list[list[str]] = [[""] * sampling.n for _ in prompts]
    fits = [i for i, ids in enumerate(encoded) if len(ids) <= longest_ok]
    self.overflows += len(prompts) - len(fits)
    per_batch = max(1, self.max_rows // sampling.n)
    # Similar lengths share a batch: fewer padded slots and fewer compiled shapes.
    fits.sort(key=lambda i: len(encoded[i]))
    for start in range(0, len(fits), per_batch):
      idx = fits[start:start + per_batch]
      longest = max(len(encoded[i]) for i in idx)
      max_new = min(sampling.max_new_tokens, limit - longest)
      # A fresh, reproducible stream per call: (seed, call index).
      seed = (sampling.seed * 1_000_003 + self._calls) % (2 ** 31)
      self._calls += 1
      t0 = time.perf_counter()
      rows = self._sample([encoded[i] for i in idx], sampling, max_new, seed)
      self.device_s += time.perf_counter() - t0
      for i, samples in zip(idx, rows):
        texts = []
        for ids, reason in samples:
          self.tokens_out += len(ids)
          self.truncated += reason == "length"
          texts.append(tok.decode([t for t in ids if t not in stops]))
        results[i] = texts
    return results

  def stats(self) -> dict:
    return {"overflowed_prompts": self.overflows, "truncated_completions": self.truncated,
            "tokens_out": self.tokens_out, "sampling_s": round(self.device_s, 2)}


BUILTIN = {"oracle": OracleGenerator, "empty": EmptyGenerator}


def make_generator(spec: str, dtype: str = "float32", max_rows: int = 16,
                   tokenizer: str | None = None):
  """`oracle`, `empty`, or a model SPEC (see spade_jax.loading), optionally with the tokenizer
  of another SPEC."""
  if spec in BUILTIN:
    return BUILTIN[spec]()
  return ModelGenerator(spec, dtype=dtype, max_rows=max_rows, tokenizer=tokenizer)
