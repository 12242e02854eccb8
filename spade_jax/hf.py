"""Hugging Face checkpoint directories: config.json + safetensors in, and out.

Loading validates everything before allocating anything: the architecture, every safetensors
header (size, offsets, dtypes — so a truncated or corrupt file is caught up front), and the name
and shape of every tensor against `convert.HF_TABLES`. Only then are tensors memory-mapped and
placed, one parameter at a time, straight into their shardings. Export writes shards of at most
`max_shard_bytes` with transformers' index file when there is more than one.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

from spade_jax import convert
from spade_jax.convert import CheckpointError
from spade_jax import model as model_lib

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}
_EXPORT_ARCH = {v: k for k, v in ARCHITECTURES.items()}

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
              "F64": np.float64}


def _rope_theta(c: dict, where: str) -> float:
  rope = c.get("rope_parameters") or {}
  scaling = c.get("rope_scaling") or {}
  kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
  if kind != "default":
    raise CheckpointError(f"{where}: rope type {kind!r} is not supported (only default RoPE)")
  theta = rope.get("rope_theta", c.get("rope_theta"))
  if theta is None:
    raise CheckpointError(f"{where}: config has no rope_theta")
  return float(theta)


def config_from_hf(c: dict, where: str = "config.json", dtype: str = "float32"
                   ) -> model_lib.ModelConfig:
  """ModelConfig from a transformers config dict; unsupported features are errors, not ignored."""
  archs = c.get("architectures") or []
  family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
  if family is None:
    family = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
              "qwen3_moe": "qwen3_moe"}.get(c.get("model_type"))
  if family is None:
    raise CheckpointError(
        f"{where}: unknown architecture {archs or c.get('model_type')!r}; supported: "
        f"{sorted(ARCHITECTURES)}")
  if c.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"{where}: hidden_act {c['hidden_act']!r} is not supported (silu only)")
  if family != "qwen2" and c.get("attention_bias"):
    raise CheckpointError(f"{where}: attention_bias=True is not supported for {family}")
  if c.get("mlp_bias"):
    raise CheckpointError(f"{where}: mlp_bias=True is not supported")
  if c.get("use_sliding_window"):
    raise CheckpointError(f"{where}: sliding-window attention is not supported")
  if c.get("shared_expert_intermediate_size"):
    raise CheckpointError(f"{where}: shared experts are not supported")
  try:
    heads = int(c["num_attention_heads"])
    return model_lib.ModelConfig(
        family=family, vocab_size=int(c["vocab_size"]), d_model=int(c["hidden_size"]),
        n_layers=int(c["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
        d_ff=int(c["intermediate_size"] if family != "qwen3_moe" else
                 c.get("intermediate_size", 6144)), rope_theta=_rope_theta(c, where),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)), qk_norm=family in ("qwen3", "qwen3_moe"),
        qkv_bias=family == "qwen2", tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_seq_len=int(c.get("max_position_embeddings", 4096)), dtype=dtype,
        **_moe_fields(c, family))
  except KeyError as e:
    raise CheckpointError(f"{where}: missing field {e.args[0]!r}") from None
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from None


def _moe_fields(c: dict, family: str) -> dict[str, Any]:
  """The MoE fields of a Qwen3-MoE config.json; absent ones take transformers' Qwen3MoeConfig
  defaults, so the same file means the same model to both (norm_topk_prob is False there, while
  the released checkpoints set it True). router_aux_loss_coef is a training knob, ours in the
  learner's config, and is not read."""
  if family != "qwen3_moe":
    return {}
  return dict(n_experts=int(c.get("num_experts", c.get("num_local_experts", 128))),
              experts_per_token=int(c.get("num_experts_per_tok", 8)),
              d_ff_expert=int(c.get("moe_intermediate_size", 768)),
              norm_topk_prob=bool(c.get("norm_topk_prob", False)),
              decoder_sparse_step=int(c.get("decoder_sparse_step", 1)),
              mlp_only_layers=tuple(int(i) for i in c.get("mlp_only_layers") or ()))


def config_to_hf(cfg: model_lib.ModelConfig) -> dict[str, Any]:
  moe = {} if not cfg.n_experts else {
      "num_experts": cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token,
      "moe_intermediate_size": cfg.d_ff_expert, "norm_topk_prob": cfg.norm_topk_prob,
      "decoder_sparse_step": cfg.decoder_sparse_step,
      "mlp_only_layers": list(cfg.mlp_only_layers)}
  return {
      "architectures": [_EXPORT_ARCH[cfg.family]], "model_type": cfg.family,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
      "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
      "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
      "intermediate_size": cfg.d_ff, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len,
      "attention_bias": cfg.qkv_bias, "torch_dtype": "float32", **moe,
  }


# ---------------------------------------------------------------------------------------------
# safetensors, read through our own validated header parser and a memory map


def read_safetensors_header(path: str) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
  """{name: (dtype, shape, begin, end)} with absolute byte offsets; validates the whole layout."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) < 8:
      raise CheckpointError(f"{path}: truncated safetensors file (no header)")
    (n,) = struct.unpack("<Q", raw)
    if n > min(size - 8, 100 << 20):
      raise CheckpointError(f"{path}: corrupt or truncated safetensors header (length {n})")
    try:
      header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from None
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
      raise CheckpointError(f"{path}: malformed header entry for {name!r}") from None
    if dtype not in _ST_DTYPES:
      raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_ST_DTYPES[dtype]).itemsize
    if e - b != nbytes or b < 0:
      raise CheckpointError(f"{path}: tensor {name!r} has inconsistent byte offsets")
    if 8 + n + e > size:
      raise CheckpointError(f"{path}: truncated: tensor {name!r} ends past the end of the file")
    out[name] = (dtype, shape, 8 + n + b, 8 + n + e)
  return out


def _safetensors_files(directory: str) -> list[str]:
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      try:
        weight_map = json.load(f)["weight_map"]
      except (json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{index}: malformed index ({e})") from None
    files = sorted(set(weight_map.values()))
  else:
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  if not files:
    raise CheckpointError(f"{directory}: no *.safetensors files")
  paths = [os.path.join(directory, f) for f in files]
  for p in paths:
    if not os.path.exists(p):
      raise CheckpointError(f"{directory}: the index names {os.path.basename(p)}, which is missing")
  return paths


class SafetensorsDir:
  """All tensors of a checkpoint directory: names/shapes up front, data memory-mapped on demand."""

  def __init__(self, directory: str):
    self.entries = {}
    for path in _safetensors_files(directory):
      for name, entry in read_safetensors_header(path).items():
        self.entries[name] = (path, *entry)
    self._maps: dict[str, np.memmap] = {}

  def shapes(self) -> dict[str, tuple[int, ...]]:
    return {name: e[2] for name, e in self.entries.items()}

  def read(self, name: str) -> np.ndarray:
    path, dtype, shape, b, e = self.entries[name]
    if path not in self._maps:
      self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
    return self._maps[path][b:e].view(_ST_DTYPES[dtype]).reshape(shape)


def read_config(directory: str, dtype: str = "float32") -> model_lib.ModelConfig:
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise CheckpointError(f"{directory}: no config.json")
  with open(path) as f:
    try:
      c = json.load(f)
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{path}: invalid JSON ({e})") from None
  return config_from_hf(c, path, dtype)


def open_checkpoint(directory: str, cfg: model_lib.ModelConfig):
  """Validates the directory against `cfg`; returns {our path: host-array thunk}."""
  st = SafetensorsDir(directory)
  table = convert.HF_TABLES[cfg.family]
  shapes = st.shapes()
  if cfg.tie_embeddings:
    shapes.pop("lm_head.weight", None)  # some tied checkpoints store a copy; we ignore it
  convert.check_tensors(cfg, table, shapes, directory)
  return convert.host_loaders(cfg, table, st.read)


def export(directory: str, cfg: model_lib.ModelConfig, params, tokenizer=None,
           max_shard_bytes: int = 5 << 30) -> None:
  """Writes a transformers-loadable directory (config.json, safetensors, tokenizer): one
  model.safetensors, or shards of at most `max_shard_bytes` and model.safetensors.index.json.
  Tensors stream to disk a shard at a time (a stacked parameter leaves the devices a layer at a
  time), so the host holds about one shard."""
  from safetensors.numpy import save_file

  os.makedirs(directory, exist_ok=True)
  shards, current, size = [], {}, 0
  names = []

  def flush():
    nonlocal current, size
    if current:
      tmp = os.path.join(directory, f"shard-{len(shards):05d}.tmp")
      save_file(current, tmp, metadata={"format": "pt"})
      shards.append((tmp, list(current)))
    current, size = {}, 0

  for name, x in convert.external_tensors(cfg, params, convert.HF_TABLES[cfg.family]):
    if current and size + x.nbytes > max_shard_bytes:
      flush()
    current[name], size = x, size + x.nbytes
    names.append(name)
  flush()
  for stale in os.listdir(directory):  # a previous export's shards would join the new index
    if stale.startswith("model") and stale.endswith((".safetensors", ".index.json")):
      os.remove(os.path.join(directory, stale))
  if len(shards) == 1:
    os.replace(shards[0][0], os.path.join(directory, "model.safetensors"))
  else:
    weight_map = {}
    for n, (tmp, tensors) in enumerate(shards):
      file = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
      os.replace(tmp, os.path.join(directory, file))
      weight_map.update({t: file for t in tensors})
    total = sum(os.path.getsize(os.path.join(directory, f)) for f in set(weight_map.values()))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config_to_hf(cfg), f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(directory)
