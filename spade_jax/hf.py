"""Hugging Face checkpoint directories: config.json + safetensors in, and out.

Loading validates everything before allocating anything: the architecture, every safetensors
header (size, offsets, dtypes — so a truncated or corrupt file is caught up front), and the name
and shape of every tensor against `convert.HF_TABLES`. Only then are tensors memory-mapped and
placed, one parameter at a time, straight into their shardings.
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
                 "Qwen3ForCausalLM": "qwen3"}
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
    family = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(c.get("model_type"))
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
  try:
    heads = int(c["num_attention_heads"])
    return model_lib.ModelConfig(
        family=family, vocab_size=int(c["vocab_size"]), d_model=int(c["hidden_size"]),
        n_layers=int(c["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
        d_ff=int(c["intermediate_size"]), rope_theta=_rope_theta(c, where),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)), qk_norm=family == "qwen3",
        qkv_bias=family == "qwen2", tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_seq_len=int(c.get("max_position_embeddings", 4096)), dtype=dtype)
  except KeyError as e:
    raise CheckpointError(f"{where}: missing field {e.args[0]!r}") from None


def config_to_hf(cfg: model_lib.ModelConfig) -> dict[str, Any]:
  return {
      "architectures": [_EXPORT_ARCH[cfg.family]], "model_type": cfg.family,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
      "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
      "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
      "intermediate_size": cfg.d_ff, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len,
      "attention_bias": cfg.qkv_bias, "torch_dtype": "float32",
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


def export(directory: str, cfg: model_lib.ModelConfig, params, tokenizer=None) -> None:
  """Writes a transformers-loadable directory (config.json, model.safetensors, tokenizer)."""
  from safetensors.numpy import save_file

  os.makedirs(directory, exist_ok=True)
  tensors = convert.external_tensors(cfg, params, convert.HF_TABLES[cfg.family])
  tmp = os.path.join(directory, "model.safetensors.tmp")
  save_file(tensors, tmp, metadata={"format": "pt"})
  os.replace(tmp, os.path.join(directory, "model.safetensors"))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config_to_hf(cfg), f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(directory)
