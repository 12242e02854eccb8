"""Checkpoints with orbax: the learner's state, the loop's host state, and enough to load a model.

A checkpoint root holds one directory per saved step (kept: the last `keep`), each with four
items: "params" (float32 master parameters), "train" (step, optimizer state, RNG), "host" (any
JSON-able dict from the caller: pool, memory, delayed designer samples, iterator positions) and
"meta" (the model config and a tokenizer reference). Writes are atomic (orbax finalises a step
by renaming its temporary directory) and asynchronous: `save` returns once the arrays are copied
off the device, so the next train step may donate them; `wait` blocks until the files are done.
Restores go straight into any mesh's shardings. Because the model config is stored, a root or
step directory also works as a model SPEC (`loading.load_model`, `spade_jax.generate --model`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

from spade_jax import gguf_io, sharding
from spade_jax import model as model_lib
from spade_jax.convert import CheckpointError

FORMAT = "spade_jax.checkpoint/1"
ITEMS = ("params", "train", "host", "meta")


def manager(directory: str, keep: int = 3, async_save: bool = True) -> ocp.CheckpointManager:
  """A manager for the checkpoint root `directory` keeping the last `keep` steps."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                         create=True)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=ITEMS)


def save(mgr: ocp.CheckpointManager, state, model_cfg: model_lib.ModelConfig,
         host_state: Mapping[str, Any] | None = None, tokenizer: str | None = None,
         step: int | None = None) -> int:
  """Saves a `learner.TrainState` plus the caller's host state; returns the step it was saved as.

  tokenizer: the SPEC the model came from (an embedded name, HF directory or .gguf path) so the
  checkpoint can be used for generation; None when there is none (random models).
  """
  step = int(state.step) if step is None else int(step)
  meta = {"format": FORMAT, "model_config": dataclasses.asdict(model_cfg),
          "tokenizer": tokenizer, "step": step}
  train = {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}
  mgr.save(step, args=ocp.args.Composite(
      params=ocp.args.StandardSave(state.params),
      train=ocp.args.StandardSave(train),
      host=ocp.args.JsonSave(dict(host_state or {})),
      meta=ocp.args.JsonSave(meta)))
  return step


def wait(mgr: ocp.CheckpointManager) -> None:
  """Blocks until every pending asynchronous save is on disk."""
  mgr.wait_until_finished()


def _abstract(tree_of_arrays_or_shardings, template):
  """ShapeDtypeStructs carrying the target shardings, for restoring straight into a mesh."""
  return jax.tree.map(lambda s, t: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s),
                      tree_of_arrays_or_shardings, template)


def restore(mgr: ocp.CheckpointManager, learner, step: int | None = None):
  """(TrainState in `learner`'s shardings, host state dict) from `step` (default: the latest)."""
  from spade_jax import learner as learner_lib  # the learner module imports jax-heavy deps

  step = mgr.latest_step() if step is None else step
  if step is None:
    raise CheckpointError(f"{mgr.directory}: no checkpoint to restore")
  meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  _check_meta(meta, str(mgr.directory))
  saved_cfg = model_lib.ModelConfig(**meta["model_config"])
  if dataclasses.replace(saved_cfg, dtype="float32") != learner.model_cfg.replace(
      dtype="float32"):
    raise CheckpointError(f"{mgr.directory} step {step}: saved model {saved_cfg} does not match "
                          f"the learner's {learner.model_cfg}")
  sh = learner.state_shardings
  shapes = jax.eval_shape(lambda: model_lib.init_params(learner.model_cfg, jax.random.key(0)))
  opt_tx = learner_lib.optimizer(learner.cfg)
  abstract_train = {
      "step": jax.ShapeDtypeStruct((), "int32", sharding=sh.step),
      "opt_state": _abstract(sh.opt_state, jax.eval_shape(opt_tx.init, shapes)),
      "rng": jax.ShapeDtypeStruct((2,), "uint32", sharding=sh.rng),
  }
  out = mgr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(_abstract(sh.params, shapes)),
      train=ocp.args.StandardRestore(abstract_train),
      host=ocp.args.JsonRestore()))
  t = out["train"]
  state = learner_lib.TrainState(t["step"], out["params"], t["opt_state"], t["rng"])
  return state, dict(out["host"])


# ---------------------------------------------------------------------------------------------
# A checkpoint as a model SPEC


def _check_meta(meta, where: str) -> None:
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise CheckpointError(f"{where}: not a {FORMAT} checkpoint (meta: {str(meta)[:200]})")


def step_dir(path: str) -> str | None:
  """The step directory `path` names: itself if it holds the items, else the root's latest
  finished step. None if `path` is not a checkpoint."""
  path = os.path.abspath(path)
  if step_dir_ok(path):
    return path
  if not os.path.isdir(path):
    return None
  steps = [d for d in os.listdir(path) if d.isdigit() and step_dir_ok(os.path.join(path, d))]
  return os.path.join(path, max(steps, key=int)) if steps else None


def step_dir_ok(d: str) -> bool:
  return os.path.isdir(os.path.join(d, "meta")) and os.path.isdir(os.path.join(d, "params"))


def tokenizer_path(ref: str | None) -> str | None:
  """Where `load_tokenizer` finds the tokenizer of a stored SPEC reference."""
  if ref is None:
    return None
  return gguf_io.embedded_gguf_path(ref) if ref in gguf_io.EMBEDDED else ref


def load_params(path: str, mesh: jax.sharding.Mesh, rules: Mapping[str, tuple[str, ...]],
                dtype: str = "float32"):
  """(model config, params in the mesh's shardings, tokenizer reference) from a checkpoint."""
  d = step_dir(path)
  if d is None:
    raise CheckpointError(f"{path}: no finished checkpoint step found")
  ckptr = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
  meta = ckptr.restore(d, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  _check_meta(meta, d)
  cfg = model_lib.ModelConfig(**dict(meta["model_config"], dtype=dtype))
  shapes = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.key(0)))
  target = _abstract(sharding.param_shardings(cfg, mesh, rules), shapes)
  params = ckptr.restore(d, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(target)))["params"]
  return cfg, params, meta["tokenizer"]
