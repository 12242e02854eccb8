"""Name and layout mapping between our parameters and Hugging Face / GGUF checkpoints.

One declarative table per checkpoint family maps each of our parameter paths to the external
tensor name (with `{i}` for the layer index and, for a checkpoint that stores each expert
apart, `{j}` for the expert) and a layout. External linear weights are [out, in]; ours put the
input dims first and split heads out ([D, H, Dh], [H, Dh, D], [D, F]). The layouts below say
how to go between the two, in both directions, so that loading, validation and export all read
the same table. Our stacked parameters ("layers/...", and a MoE model's "mlp/..." and "moe/...")
hold one row per layer of their stack (`stack_layers`), and an expert weight [layers, E, ...]
one row per expert, so per-expert tensors become stacked [E, ...] arrays and back.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import numpy as np

from spade_jax import model as model_lib


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one external tensor relates to ours. `n_in` = number of our dims (after `lead` shared
  leading dims, e.g. GGUF's stacked experts) that are the linear layer's input (the external
  tensor is [*lead, prod(out dims), prod(in dims)]); 0 = same elements, external shape either
  ours ("copy") or flattened ("flat")."""
  n_in: int = 0
  flat: bool = False
  lead: int = 0

  def external_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
    lead, ours = tuple(ours[:self.lead]), ours[self.lead:]
    if self.n_in:
      return lead + (math.prod(ours[self.n_in:]), math.prod(ours[:self.n_in]))
    return lead + ((math.prod(ours),) if self.flat else tuple(ours))

  def to_ours(self, ext: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
    return (np.swapaxes(ext, -1, -2) if self.n_in else ext).reshape(ours)

  def to_external(self, x: np.ndarray) -> np.ndarray:
    lead = x.shape[:self.lead]
    if self.n_in:
      return np.swapaxes(x.reshape(*lead, math.prod(x.shape[self.lead:self.lead + self.n_in]),
                                   -1), -1, -2)
    return x.reshape(*lead, -1) if self.flat else x


COPY, FLAT = Layout(), Layout(flat=True)
LINEAR_IN1, LINEAR_IN2 = Layout(n_in=1), Layout(n_in=2)
EXPERTS_IN1 = Layout(n_in=1, lead=1)  # [E, out, in] <-> [E, in, out]

_HF_BASE = {
    "embed": ("model.embed_tokens.weight", COPY),
    "final_norm": ("model.norm.weight", COPY),
    "lm_head": ("lm_head.weight", LINEAR_IN1),
    "layers/attn_norm": ("model.layers.{i}.input_layernorm.weight", COPY),
    "layers/wq": ("model.layers.{i}.self_attn.q_proj.weight", LINEAR_IN1),
    "layers/wk": ("model.layers.{i}.self_attn.k_proj.weight", LINEAR_IN1),
    "layers/wv": ("model.layers.{i}.self_attn.v_proj.weight", LINEAR_IN1),
    "layers/wo": ("model.layers.{i}.self_attn.o_proj.weight", LINEAR_IN2),
    "layers/mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", COPY),
    "layers/w_gate": ("model.layers.{i}.mlp.gate_proj.weight", LINEAR_IN1),
    "layers/w_up": ("model.layers.{i}.mlp.up_proj.weight", LINEAR_IN1),
    "layers/w_down": ("model.layers.{i}.mlp.down_proj.weight", LINEAR_IN1),
}
_HF_QKV_BIAS = {
    "layers/bq": ("model.layers.{i}.self_attn.q_proj.bias", FLAT),
    "layers/bk": ("model.layers.{i}.self_attn.k_proj.bias", FLAT),
    "layers/bv": ("model.layers.{i}.self_attn.v_proj.bias", FLAT),
}
_HF_QK_NORM = {
    "layers/q_norm": ("model.layers.{i}.self_attn.q_norm.weight", COPY),
    "layers/k_norm": ("model.layers.{i}.self_attn.k_norm.weight", COPY),
}
# Qwen3-MoE: dense layers' MLPs (mlp_only_layers) keep the dense names; a sparse layer has a
# router ("gate") and one gate/up/down projection per expert.
_HF_MOE = {
    "mlp/w_gate": ("model.layers.{i}.mlp.gate_proj.weight", LINEAR_IN1),
    "mlp/w_up": ("model.layers.{i}.mlp.up_proj.weight", LINEAR_IN1),
    "mlp/w_down": ("model.layers.{i}.mlp.down_proj.weight", LINEAR_IN1),
    "moe/router": ("model.layers.{i}.mlp.gate.weight", LINEAR_IN1),
    "moe/w_gate": ("model.layers.{i}.mlp.experts.{j}.gate_proj.weight", LINEAR_IN1),
    "moe/w_up": ("model.layers.{i}.mlp.experts.{j}.up_proj.weight", LINEAR_IN1),
    "moe/w_down": ("model.layers.{i}.mlp.experts.{j}.down_proj.weight", LINEAR_IN1),
}
HF_TABLES = {
    "llama": _HF_BASE,
    "qwen2": {**_HF_BASE, **_HF_QKV_BIAS},
    "qwen3": {**_HF_BASE, **_HF_QK_NORM},
    "qwen3_moe": {**_HF_BASE, **_HF_QK_NORM, **_HF_MOE},
}

# GGUF tensor names (numpy order, i.e. [out, in] like HF). llama.cpp's converter interleaves the
# rotary halves of q/k rows for the llama architecture; `GGUF_ROPE_PERMUTED` undoes that.
_GGUF_BASE = {
    "embed": ("token_embd.weight", COPY),
    "final_norm": ("output_norm.weight", COPY),
    "lm_head": ("output.weight", LINEAR_IN1),
    "layers/attn_norm": ("blk.{i}.attn_norm.weight", COPY),
    "layers/wq": ("blk.{i}.attn_q.weight", LINEAR_IN1),
    "layers/wk": ("blk.{i}.attn_k.weight", LINEAR_IN1),
    "layers/wv": ("blk.{i}.attn_v.weight", LINEAR_IN1),
    "layers/wo": ("blk.{i}.attn_output.weight", LINEAR_IN2),
    "layers/mlp_norm": ("blk.{i}.ffn_norm.weight", COPY),
    "layers/w_gate": ("blk.{i}.ffn_gate.weight", LINEAR_IN1),
    "layers/w_up": ("blk.{i}.ffn_up.weight", LINEAR_IN1),
    "layers/w_down": ("blk.{i}.ffn_down.weight", LINEAR_IN1),
}
GGUF_TABLES = {
    "llama": _GGUF_BASE,
    "qwen2": {**_GGUF_BASE, "layers/bq": ("blk.{i}.attn_q.bias", FLAT),
              "layers/bk": ("blk.{i}.attn_k.bias", FLAT),
              "layers/bv": ("blk.{i}.attn_v.bias", FLAT)},
    "qwen3": {**_GGUF_BASE, "layers/q_norm": ("blk.{i}.attn_q_norm.weight", COPY),
              "layers/k_norm": ("blk.{i}.attn_k_norm.weight", COPY)},
}
# llama.cpp stores a layer's experts as one [E, out, in] tensor.
GGUF_TABLES["qwen3_moe"] = {
    **GGUF_TABLES["qwen3"], "moe/router": ("blk.{i}.ffn_gate_inp.weight", LINEAR_IN1),
    "moe/w_gate": ("blk.{i}.ffn_gate_exps.weight", EXPERTS_IN1),
    "moe/w_up": ("blk.{i}.ffn_up_exps.weight", EXPERTS_IN1),
    "moe/w_down": ("blk.{i}.ffn_down_exps.weight", EXPERTS_IN1)}
GGUF_ROPE_PERMUTED = {"llama": {"layers/wq": "n_heads", "layers/wk": "n_kv_heads"}}


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's q/k row interleaving: per head, rows (pairs) -> (halves)."""
  half = w.shape[0] // n_heads // 2
  return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stack_layers(cfg: model_lib.ModelConfig, path: str) -> tuple[int, ...] | None:
  """The layer index of each row of a stacked parameter (None: not stacked)."""
  group = path.split("/")[0]
  if group == "layers":
    return tuple(range(cfg.n_layers))
  return {"mlp": cfg.dense_layers, "moe": cfg.sparse_layers}.get(group)


def _pieces(cfg: model_lib.ModelConfig, path: str, name: str, shape: tuple[int, ...]):
  """[(external name, index into our array, the piece's own shape)] of one parameter: one per
  layer of its stack, and per expert where the checkpoint names experts apart ({j})."""
  layers = stack_layers(cfg, path)
  if layers is None:
    return [(name, (), shape)]
  if "{j}" in name:
    return [(name.format(i=i, j=j), (r, j), shape[2:]) for r, i in enumerate(layers)
            for j in range(shape[1])]
  return [(name.format(i=i), (r,), shape[1:]) for r, i in enumerate(layers)]


def external_names(cfg: model_lib.ModelConfig, table: Mapping) -> dict[str, tuple[str, tuple]]:
  """{external tensor name: (our path, expected external shape)} for every tensor the model needs."""
  out = {}
  for path, spec in model_lib.param_table(cfg).items():
    if path not in table:
      raise KeyError(f"no checkpoint name for parameter {path!r} in the {cfg.family} table")
    name, layout = table[path]
    for ext, _, shape in _pieces(cfg, path, name, spec.shape):
      out[ext] = (path, layout.external_shape(shape))
  return out


def check_tensors(cfg: model_lib.ModelConfig, table: Mapping,
                  available: Mapping[str, tuple[int, ...]], source: str) -> None:
  """Raises one error listing every missing or mis-shaped tensor, before anything is loaded."""
  problems = []
  for name, (_, shape) in external_names(cfg, table).items():
    if name not in available:
      problems.append(f"missing tensor {name!r}")
    elif tuple(available[name]) != tuple(shape):
      problems.append(f"tensor {name!r} has shape {tuple(available[name])}, expected {shape}")
  if problems:
    more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
    raise CheckpointError(f"{source}: checkpoint does not match the model: " + "; ".join(problems[:10])
                     + more)


def host_loaders(cfg: model_lib.ModelConfig, table: Mapping, read: Callable[[str], np.ndarray],
                 transforms: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None
                 ) -> dict[str, Callable[[], np.ndarray]]:
  """{our path: thunk building that float32 host array}; stacked params read piece by piece."""
  transforms = transforms or {}

  def loader(path, spec):
    name, layout = table[path]
    t = transforms.get(path, lambda a: a)

    def build():
      pieces = _pieces(cfg, path, name, spec.shape)
      if len(pieces) == 1 and pieces[0][1] == ():
        return layout.to_ours(t(np.asarray(read(name), np.float32)), spec.shape)
      out = np.empty(spec.shape, np.float32)
      for ext, idx, shape in pieces:
        out[idx] = layout.to_ours(t(np.asarray(read(ext), np.float32)), shape)
      return out
    return build

  return {path: loader(path, spec) for path, spec in model_lib.param_table(cfg).items()}


def external_tensors(cfg: model_lib.ModelConfig, params, table: Mapping):
  """Our params -> (external name, float32 array) pairs, the inverse of `host_loaders`, one
  piece at a time: a stacked parameter is copied to the host a layer at a time."""
  flat = model_lib.flatten(params)
  for path, spec in model_lib.param_table(cfg).items():
    name, layout = table[path]
    pieces = _pieces(cfg, path, name, spec.shape)
    if stack_layers(cfg, path) is None:
      yield name, np.ascontiguousarray(layout.to_external(np.asarray(flat[path], np.float32)))
      continue
    for r in range(spec.shape[0]):
      row = np.asarray(flat[path][r], np.float32)
      for ext, idx, _ in pieces:
        if idx[0] == r:
          yield ext, np.ascontiguousarray(layout.to_external(row[idx[1:]]))
