"""ml-collections configs from the command line: `--config=configs/x.py:arg --config.a.b=value`.

`configs/<family>.py` files expose `get_config(arg)`. Overrides may only set keys the file
declares (the config is locked) and are parsed against the declared value's type, so a typo or a
wrong type is an error at start, not a silent default. Nothing derived is written back.
JAX is imported only when a config is built (the mesh and rule sections), so that a CLI can
answer `--help` from a config file's module without it.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
from typing import Sequence

import ml_collections


def shipped_dir() -> str:
  """The folder of the configs that ship with the project (`configs/` of the checkout, or
  `spade_jax/configs` of an installed package)."""
  spec = importlib.util.find_spec("spade_jax.configs")
  return list(spec.submodule_search_locations)[0]


def resolve(path: str) -> str:
  """A config file path as given, or else the same name among the shipped configs, so that
  `--config=configs/spade.py` works from any directory."""
  if os.path.exists(path):
    return path
  name = os.path.normpath(path)
  if name.startswith("configs" + os.sep):
    name = name[len("configs" + os.sep):]
  shipped = os.path.join(shipped_dir(), name)
  if not os.path.isabs(path) and os.path.isfile(shipped):
    return shipped
  raise FileNotFoundError(f"config file {path!r} does not exist (nor {shipped!r} among the "
                          f"shipped configs: {sorted(shipped_names())})")


def shipped_names() -> list[str]:
  return [f for f in os.listdir(shipped_dir()) if f.endswith(".py") and not f.startswith("_")]


def shipped(name: str) -> str:
  """The path of one shipped config file, e.g. shipped("spade.py")."""
  return os.path.join(shipped_dir(), name)


def load_module(spec: str):
  """The module of config file 'path/to/file.py[:arg]' (arg ignored), e.g. to read its PRESETS."""
  path = resolve(spec.partition(":")[0])
  module_spec = importlib.util.spec_from_file_location(f"_spade_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load(spec: str) -> ml_collections.ConfigDict:
  """'path/to/file.py[:arg]' -> the file's get_config(arg), locked. A relative path that does
  not exist is looked up among the shipped configs."""
  path, _, arg = spec.partition(":")
  path = resolve(path)
  module = load_module(path)
  if not hasattr(module, "get_config"):
    raise AttributeError(f"config file {path!r} has no get_config(arg)")
  cfg = module.get_config(arg or None)
  cfg.lock()
  return cfg


def _parse_value(key: str, text: str, current):
  if isinstance(current, bool):
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0"):
      raise ValueError(f"--config.{key}: expected true/false, got {text!r}")
    return lowered in ("true", "1")
  if isinstance(current, str):
    return text
  if isinstance(current, (int, float)):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise ValueError(f"--config.{key}: expected a number, got {text!r}") from None
    if isinstance(current, int) and not isinstance(value, int):
      raise ValueError(f"--config.{key}: expected an integer, got {text!r}")
    return type(current)(value)
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if current is None:
      return text
    raise ValueError(f"--config.{key}: cannot parse {text!r} as {type(current).__name__}") from None


def override(cfg: ml_collections.ConfigDict, assignments: Sequence[str]) -> None:
  """Applies ['a.b=value', ...] in place; unknown keys and wrong types are errors."""
  for assignment in assignments:
    key, sep, text = assignment.partition("=")
    if not sep:
      raise ValueError(f"--config.{assignment}: expected --config.KEY=VALUE")
    *parents, leaf = key.split(".")
    node = cfg
    for p in parents:
      if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
        raise KeyError(f"--config.{key}: {p!r} is not a config section")
      node = node[p]
    if leaf not in node:
      raise KeyError(f"--config.{key}: unknown key; known keys here: {sorted(node.keys())}")
    current = node[leaf]
    value = _parse_value(key, text, current)
    if isinstance(current, tuple) and isinstance(value, list):
      value = tuple(value)
    try:
      node[leaf] = value
    except TypeError as e:
      raise TypeError(f"--config.{key}: {e}") from None


def split_argv(argv: Sequence[str], default: str) -> tuple[str, list[str], list[str]]:
  """Pulls `--config=...` and `--config.k=v` out of argv, loading nothing: returns (config spec,
  ['k=v', ...], remaining args)."""
  spec, assignments, rest = default, [], []
  args = list(argv)
  while args:
    a = args.pop(0)
    if a == "--config" and args:
      spec = args.pop(0)
    elif a.startswith("--config="):
      spec = a.split("=", 1)[1]
    elif a.startswith("--config."):
      body = a[len("--config."):]
      if "=" not in body and args:
        body = f"{body}={args.pop(0)}"
      assignments.append(body)
    else:
      rest.append(a)
  return spec, assignments, rest


def build(spec: str, assignments: Sequence[str]) -> ml_collections.ConfigDict:
  """The config of `spec` with the overrides applied."""
  cfg = load(spec)
  override(cfg, assignments)
  return cfg


def from_argv(argv: Sequence[str], default: str) -> tuple[ml_collections.ConfigDict, list[str]]:
  """Pulls `--config=...` and `--config.k=v` out of argv; returns (config, remaining args)."""
  spec, assignments, rest = split_argv(argv, default)
  return build(spec, assignments), rest


def add_help(parser: argparse.ArgumentParser, default: str, metavar: str) -> None:
  """Lists `--config=FILE[:ARG]` and `--config.KEY=VALUE` in a CLI's help. `split_argv` takes
  them out of argv first, so argparse only ever shows them."""
  parser.add_argument(
      "--config", metavar=metavar, default=argparse.SUPPRESS,
      help=f"config file and its get_config argument (default: {default}); a FILE not found "
      f"from the working directory is looked up among the shipped configs "
      f"({', '.join(sorted(shipped_names()))})")
  parser.add_argument(
      "--config.KEY", metavar="VALUE", default=argparse.SUPPRESS,
      help="set one field the config declares, also nested (--config.mesh.fsdp=-1); the value "
      "is parsed as the declared type; an unknown key or a wrong type is an error at start")


# Shared sections, used by every config file that runs a model.


def mesh_config() -> ml_collections.ConfigDict:
  """Mesh sizes; -1 takes the remaining devices ("expert" splits a MoE model's experts)."""
  return ml_collections.ConfigDict({"data": -1, "fsdp": 1, "expert": 1, "tensor": 1})


def rules_config() -> ml_collections.ConfigDict:
  """Logical axis -> tuple of mesh axes (see spade_jax/sharding.py)."""
  from spade_jax import sharding

  return ml_collections.ConfigDict({k: tuple(v) for k, v in sharding.DEFAULT_RULES.items()})


def validate_mesh(cfg: ml_collections.ConfigDict) -> None:
  from spade_jax import sharding

  sizes = [cfg.mesh[a] for a in sharding.MESH_AXES]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh: sizes must be positive with at most one -1, got {cfg.mesh.to_dict()}")
  for name, axes in cfg.rules.items():
    bad = [a for a in axes if a not in sharding.MESH_AXES]
    if bad:
      raise ValueError(f"rules.{name}: unknown mesh axes {bad}; mesh axes are {sharding.MESH_AXES}")
