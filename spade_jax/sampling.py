"""Batched sampling for both SPADE roles: one-shot generation and multi-turn conversations.

Public API (host side; all device work happens in two jitted programs):

  sampler = Sampler.for_model(loaded)                   # or Sampler(cfg, mesh, eos_ids=...)
  out = sampler.generate(params, prompts, settings, seed, num_samples=G)
  conv, out = sampler.start(params, prompts, settings, seed, num_samples=G)
  conv, out = sampler.extend(params, conv, new_tokens, settings, seed)

`prompts` are token-id lists; conversation i * G + g is sample g of prompt i (the G samples share
one prefill). `extend` continues every conversation whose entry in `new_tokens` is a token list
(the observation / user-turn tokens to append, e.g. `tokenizer.user_turn_tokens`) and drops, for
good, those whose entry is None: their cache rows are compacted away so an ended episode costs
nothing. Only the new tokens are prefilled; the turn's final sampled token is fed first. An
`Output` has one row per conversation: tokens, log-probs (see `logprobs.py`), lengths and finish
reasons; rows not continued in a call have length 0 and reason "none".

Routing (a MoE model, `Sampler(routing=True)`): the Output also says which experts every token
fed in the call was routed to, in token order: `prefill_experts[i]` for the tokens prefilled
(the prompt, or the previous turn's last sampled token and the observation), then
`experts[i, :lengths[i] - 1]` for the sampled tokens (the last one is fed by the next call).
Turn after turn these cover every token of a conversation but its very last, which is what the
learner replays (`rl.routing_replay` builds its batch row).

Shapes are bucketed (batch: powers of two; prompt chunk and cache capacity: `kv_cache.ladder`;
prompts longer than MAX_CHUNK go in several chunks of one compiled program), so a second call
of the same bucket reuses the compiled program. `extend` donates the previous
cache: a `Conversations` value must not be used twice.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from spade_jax import decode
from spade_jax import kv_cache
from spade_jax import model as model_lib
from spade_jax import moe as moe_lib
from spade_jax import sharding as sharding_lib
from spade_jax.kv_cache import Cache

FINISH_REASONS = decode.FINISH_REASONS


@dataclasses.dataclass(frozen=True)
class Settings:
  """How to sample. temperature 0 = greedy; top_k 0 and top_p 1 switch those cuts off."""

  max_new_tokens: int = 256
  temperature: float = 0.6
  top_k: int = 20
  top_p: float = 0.95
  ignore_eos: bool = False  # benchmarks: always produce max_new_tokens

  def __post_init__(self):
    if self.max_new_tokens <= 0:
      raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
    if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
      raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {self}")


GREEDY = Settings(temperature=0.0, top_k=0, top_p=1.0)


class Output(NamedTuple):
  tokens: np.ndarray  # int32 [N, max_new_tokens], 0 past each row's length
  logprobs: np.ndarray  # float32 [N, max_new_tokens], 0 past each row's length
  lengths: np.ndarray  # int32 [N]
  finish: np.ndarray  # int32 [N], index into FINISH_REASONS
  # With routing: int16 [N, max_new_tokens, Ls, k], -1 where no token was fed
  experts: np.ndarray | None = None
  prefill_experts: tuple | None = None  # With routing: per row int16 [tokens prefilled, Ls, k]

  def token_lists(self) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]

  def finish_reasons(self) -> list[str]:
    return [FINISH_REASONS[int(f)] for f in self.finish]


@dataclasses.dataclass
class Conversations:
  """A batch of conversations whose context lives in a device KV cache."""

  cache: Cache
  rows: np.ndarray  # [B] conversation index held by each cache row, -1 for an empty row
  last: np.ndarray  # [N] last sampled token of each conversation (not yet in the cache)
  pos: np.ndarray  # [N] tokens of each conversation in the cache
  alive: np.ndarray  # [N] bool: still held in the cache

  @property
  def num(self) -> int:
    return len(self.last)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """The static shape of a sampling batch on the mesh (hashable: a jit static argument)."""

  cfg: model_lib.ModelConfig
  mesh: Mesh
  rules: tuple[tuple[str, tuple[str, ...]], ...]
  B: int  # rows
  S: int  # cache capacity
  moe_impl: str = "auto"
  routing: bool = False  # return the experts of every token fed

  def cache_sh(self, B: int | None = None, S: int | None = None) -> Cache:
    return kv_cache.shardings(self.cfg, self.mesh, dict(self.rules), B or self.B, S or self.S)

  def dispatch(self) -> moe_lib.Dispatch | None:
    if not self.cfg.n_experts:
      return None
    return moe_lib.make_dispatch(self.mesh, dict(self.rules), self.moe_impl)


@dataclasses.dataclass(frozen=True)
class _Decoding:
  """The static part of the sampling settings."""

  max_new: int
  top_k: int
  greedy: bool
  eos_ids: tuple[int, ...]
  stop_ids: tuple[int, ...]


# Prompts and observations longer than this are prefilled in chunks of this many tokens, so a
# long prompt reuses one compiled chunk program and never builds large activations.
MAX_CHUNK = 256

# The programs of a call: weights for the decode loop, an empty cache, a chunk prefill (keyed on
# the batch, chunk and capacity buckets), a repack (fan-out of the G samples / compaction), and
# the decode loop (keyed only on the batch and capacity buckets, so a new prompt or observation
# length never recompiles the expensive part).
_prepare = jax.jit(decode.prepare, static_argnames=("cfg", "vocab_major"))

# From this many rows on, the decode step's output projection reads the [V, D] matrix.
VOCAB_MAJOR_FROM = 4


@functools.partial(jax.jit, static_argnames=("layout",))
def _empty(layout: _Layout):
  return kv_cache.constrain(kv_cache.empty(layout.cfg, layout.B, layout.S), layout.cache_sh())


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnames=("cache",))
def _prefill(params, cache, tokens_BC, valid_BC, layout: _Layout):
  out = decode.prefill_chunk(params, cache, tokens_BC, valid_BC, layout.cfg, layout.dispatch(),
                             layout.routing)
  experts = out[2].astype(jnp.int16) if layout.routing else None
  return kv_cache.constrain(out[1], layout.cache_sh()), out[0], experts


@functools.partial(jax.jit, static_argnames=("layout",))
def _fan_out(cache, logits_BV, rows_B, keep_B, layout: _Layout):
  """Copies prompt rows_B[b] into row b (the G samples of a prompt share its prefill)."""
  cache = kv_cache.repack(cache, rows_B, keep_B, layout.S)
  return kv_cache.constrain(cache, layout.cache_sh()), logits_BV[rows_B]


@functools.partial(jax.jit, static_argnames=("layout",))
def _compact(cache, rows_B, keep_B, layout: _Layout):
  """Keeps rows_B of a cache, closing the gaps between turns."""
  return kv_cache.constrain(kv_cache.repack(cache, rows_B, keep_B, layout.S), layout.cache_sh())


@functools.partial(jax.jit, static_argnames=("layout", "dec"), donate_argnames=("cache",))
def _decode(w, cache, logits_BV, keep_B, sp, layout: _Layout, dec: _Decoding):
  s = decode.decode_loop(w, cache, logits_BV, keep_B, sp, layout.cfg, max_new=dec.max_new,
                         top_k=dec.top_k, greedy=dec.greedy, eos_ids=dec.eos_ids,
                         stop_ids=dec.stop_ids, cache_sh=layout.cache_sh(),
                         dispatch=layout.dispatch(), routing=layout.routing)
  return s.cache, (s.tokens_BN, s.logp_BN, s.n_B, s.finish_B, s.last_B, s.experts_BNLk)


def _chunk_len(n: int) -> int:
  """Padded length of n new tokens: a bucket up to MAX_CHUNK, else whole chunks."""
  return kv_cache.bucket(n) if n <= MAX_CHUNK else -(-n // MAX_CHUNK) * MAX_CHUNK


def _left_pad(seqs: Sequence[Sequence[int]], B: int, C: int, pad_id: int):
  tokens = np.full((B, C), pad_id, np.int32)
  valid = np.zeros((B, C), bool)
  for b, s in enumerate(seqs):
    if len(s):
      tokens[b, C - len(s):] = s
      valid[b, C - len(s):] = True
  return tokens, valid


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Samples from one model on one mesh. Stateless: the cache travels in `Conversations`."""

  cfg: model_lib.ModelConfig
  mesh: Mesh
  rules: Mapping[str, tuple[str, ...]] = dataclasses.field(
      default_factory=lambda: dict(sharding_lib.DEFAULT_RULES))
  eos_ids: tuple[int, ...] = ()  # finish reason "eos"
  stop_ids: tuple[int, ...] = ()  # finish reason "stop" (e.g. end-of-turn markers)
  pad_id: int = 0
  min_capacity: int = 64
  moe_impl: str = "auto"  # how a MoE model's experts run (`moe.IMPLS`)
  routing: bool = False  # a MoE model's outputs say which experts each fed token used

  def __post_init__(self):
    if self.routing and not self.cfg.n_experts:
      raise ValueError("routing=True needs a mixture-of-experts model")
    moe_lib.make_dispatch(None, {}, self.moe_impl)  # an unknown impl is an error here

  @classmethod
  def for_model(cls, loaded, mesh: Mesh | None = None, rules=None, **kw) -> "Sampler":
    """A sampler for `loading.load_model(...)`'s result: stops from its tokenizer, its mesh;
    `kw` sets the other fields (moe_impl, routing)."""
    from spade_jax import tokenizer as tok_lib

    leaf = jax.tree.leaves(loaded.params)[0]
    mesh = mesh or leaf.sharding.mesh
    eos, stops = (), ()
    if loaded.tokenizer is not None:
      eos_id = loaded.tokenizer.eos_token_id
      eos = () if eos_id is None else (int(eos_id),)
      stops = tuple(i for i in tok_lib.stop_token_ids(loaded.tokenizer) if i not in eos)
    return cls(loaded.cfg, mesh, dict(rules or sharding_lib.DEFAULT_RULES), eos, stops, **kw)

  # -- helpers ---------------------------------------------------------------------------------

  def _layout(self, B: int, S: int) -> _Layout:
    return _Layout(self.cfg, self.mesh, tuple(sorted((k, tuple(v)) for k, v in self.rules.items())),
                   B, S, self.moe_impl, self.routing)

  def _decoding(self, settings: Settings) -> _Decoding:
    eos = () if settings.ignore_eos else tuple(self.eos_ids)
    stop = () if settings.ignore_eos else tuple(self.stop_ids)
    return _Decoding(settings.max_new_tokens, settings.top_k, settings.temperature == 0, eos, stop)

  def _run_decode(self, params, cache, logits_BV, rows, settings, seed, layout):
    w = _prepare(params, cfg=self.cfg, vocab_major=layout.B >= VOCAB_MAJOR_FROM)
    return _decode(w, cache, logits_BV, self._put(rows >= 0),
                   self._params(rows, settings, seed), layout=layout,
                   dec=self._decoding(settings))

  def _prefill(self, params, cache, tokens, valid):
    """Prefills left-padded [B, C] tokens chunk by chunk; returns (cache, last logits, with
    routing each row's experts of its valid tokens [n_b, Ls, k], else None)."""
    B, S = cache.valid_BS.shape
    layout = self._layout(B, S)
    step = min(tokens.shape[1], MAX_CHUNK)
    experts = []
    for c in range(0, tokens.shape[1], step):
      cache, logits, e = _prefill(params, cache, self._put(tokens[:, c:c + step]),
                                  self._put(valid[:, c:c + step]), layout=layout)
      experts.append(e)
    if not self.routing:
      return cache, logits, None
    e_BCLk = np.concatenate(jax.device_get(experts), axis=1)
    return cache, logits, [e_BCLk[b][valid[b]] for b in range(B)]

  def capacity(self, need: int, capacity: int | None = None) -> int:
    """The cache capacity of a call that needs `need` slots: `capacity` when given (an error if
    below `need`), else the smallest bucket that fits."""
    if need > self.cfg.max_seq_len:
      raise ValueError(f"context of {need} tokens exceeds the model's {self.cfg.max_seq_len}")
    if capacity is None:
      return kv_cache.bucket(need, self.min_capacity)
    if capacity < need:
      raise ValueError(f"capacity {capacity} is below the {need} slots this call needs")
    return capacity

  def _put(self, x, ndim_batch=True):
    sh = (sharding_lib.batch_sharding(self.mesh, self.rules, np.ndim(x)) if ndim_batch
          else sharding_lib.replicated(self.mesh))
    return jax.device_put(x, sh)

  def _params(self, rows, settings: Settings, seed: int) -> decode.SampleParams:
    B = len(rows)
    return decode.SampleParams(
        self._put(np.full((B,), settings.temperature, np.float32)),
        self._put(np.full((B,), settings.top_p, np.float32)),
        self._put(np.maximum(rows, 0).astype(np.int32)),
        self._put(np.asarray(seed, np.int32), ndim_batch=False))

  def _finish(self, out, rows, N, last, pos, alive, cache, prefill_experts=None
              ) -> tuple[Conversations, Output]:
    tokens_BN, logp_BN, n_B, finish_B, last_B, experts_BNLk = jax.device_get(out)
    M = tokens_BN.shape[1]
    res = Output(np.zeros((N, M), np.int32), np.zeros((N, M), np.float32),
                 np.zeros((N,), np.int32), np.zeros((N,), np.int32))
    real = rows >= 0
    idx = rows[real]
    res.tokens[idx], res.logprobs[idx] = tokens_BN[real], logp_BN[real]
    res.lengths[idx], res.finish[idx] = n_B[real], finish_B[real]
    if self.routing:
      experts = np.full((N, *experts_BNLk.shape[1:]), -1, np.int16)
      experts[idx] = experts_BNLk[real]
      res = res._replace(experts=experts, prefill_experts=tuple(prefill_experts))
    last = last.copy()
    last[idx] = last_B[real]
    # Fed this call: everything sampled except the last token, which waits for the next chunk.
    pos = pos.copy()
    pos[idx] += n_B[real] - 1
    return Conversations(cache, rows, last, pos, alive), res

  # -- public ----------------------------------------------------------------------------------

  def start(self, params, prompts: Sequence[Sequence[int]], settings: Settings, seed: int,
            num_samples: int = 1, capacity: int | None = None) -> tuple[Conversations, Output]:
    """Prefills each prompt once and samples `num_samples` continuations of each."""
    if not prompts or any(len(p) == 0 for p in prompts):
      raise ValueError("every prompt needs at least one token")
    n, G = len(prompts), num_samples
    N = n * G
    mult = kv_cache.batch_multiple(self.mesh, self.rules)
    Bp, B = kv_cache.batch_bucket(n, mult), kv_cache.batch_bucket(N, mult)
    longest = max(len(p) for p in prompts)
    C = _chunk_len(longest)
    S = self.capacity(longest + settings.max_new_tokens, capacity)
    tokens, valid = _left_pad(prompts, Bp, C, self.pad_id)
    rows = np.full((B,), -1, np.int64)
    rows[:N] = np.arange(N)
    layout = self._layout(B, S)
    # The prompts are prefilled once, into a cache just large enough for the padded chunks, then
    # fanned out into the full capacity (so neither step's cost grows with the capacity).
    cache, logits, pre = self._prefill(params, _empty(self._layout(Bp, kv_cache.bucket(C))),
                                       tokens, valid)
    cache, logits = _fan_out(cache, logits,
                            self._put(np.where(rows >= 0, rows // G, 0).astype(np.int32)),
                             self._put(rows >= 0), layout=layout)
    cache, out = self._run_decode(params, cache, logits, rows, settings, seed, layout)
    pos = np.repeat(np.asarray([len(p) for p in prompts]), G)
    pre = pre and [pre[i // G] for i in range(N)]
    return self._finish(out, rows, N, np.zeros(N, np.int32), pos, np.ones(N, bool), cache, pre)

  def extend(self, params, conv: Conversations, new_tokens: Sequence[Sequence[int] | None],
             settings: Settings, seed: int, capacity: int | None = None
             ) -> tuple[Conversations, Output]:
    """Appends new_tokens[i] to conversation i and samples its next turn; None ends it."""
    if len(new_tokens) != conv.num:
      raise ValueError(f"new_tokens has {len(new_tokens)} entries for {conv.num} conversations")
    keep = np.asarray([t is not None for t in new_tokens])
    if (keep & ~conv.alive).any():
      raise ValueError(f"conversations {np.flatnonzero(keep & ~conv.alive).tolist()} ended "
                       "earlier and cannot be continued")
    ids = np.flatnonzero(keep)
    if not len(ids):
      raise ValueError("no conversation to continue")
    mult = kv_cache.batch_multiple(self.mesh, self.rules)
    B = kv_cache.batch_bucket(len(ids), mult)
    slot_of = {int(c): b for b, c in enumerate(conv.rows) if c >= 0}
    rows_old = np.zeros((B,), np.int32)
    rows_old[:len(ids)] = [slot_of[int(c)] for c in ids]
    chunks = [[int(conv.last[c])] + [int(t) for t in new_tokens[c]] for c in ids]
    longest = max(len(c) for c in chunks)
    C = _chunk_len(longest)
    m = int(conv.pos[ids].max())
    S = self.capacity(m + C + settings.max_new_tokens - 1, capacity)
    tokens, valid = _left_pad(chunks, B, C, self.pad_id)
    rows = np.full((B,), -1, np.int64)
    rows[:len(ids)] = ids
    layout = self._layout(B, S)
    # Compact the kept rows (closing the gaps), then prefill only the new tokens.
    cache = _compact(conv.cache, self._put(rows_old), self._put(rows >= 0), layout=layout)
    cache, logits, pre_B = self._prefill(params, cache, tokens, valid)
    cache, out = self._run_decode(params, cache, logits, rows, settings, seed, layout)
    pos = conv.pos.copy()
    pos[ids] += [len(c) for c in chunks]
    pre = None
    if self.routing:
      shape = (0, len(self.cfg.sparse_layers), self.cfg.experts_per_token)
      pre = [np.zeros(shape, np.int16) for _ in range(conv.num)]
      for b, c in enumerate(ids):
        pre[c] = pre_B[b]
    return self._finish(out, rows, conv.num, conv.last, pos, keep, cache, pre)

  def generate(self, params, prompts: Sequence[Sequence[int]], settings: Settings, seed: int,
               num_samples: int = 1, capacity: int | None = None) -> Output:
    """One-shot sampling (designer programs, hints, evaluation)."""
    return self.start(params, prompts, settings, seed, num_samples, capacity)[1]
