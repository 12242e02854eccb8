"""Device mesh and the logical-axis -> mesh-axis rules that place every array on it.

The mesh has the axes ("data", "fsdp", "tensor"), and "expert" when a config asks for it (a
mixture-of-experts model's expert weights split over it; see `moe` for how tokens reach them). A
rule table maps each logical axis name (the names `model.param_table` gives each parameter dim,
plus "batch" for activations) to a tuple of mesh axes; `()` means replicated. A logical name
without a rule is an error, and so is a dim that the mesh axes it maps to do not divide: nothing
is silently replicated. A rule may name a mesh axis this mesh lacks (the "experts" rule on a
dense mesh): an absent axis has size 1. Parameter shardings are derived once from
`jax.eval_shape`, and parameters are created or loaded directly into them.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from spade_jax import model as model_lib

# In device order: the last axis varies fastest (neighbouring devices), so tensor parallelism,
# the most talkative, gets the closest devices and the expert exchange the next closest.
MESH_AXES = ("data", "fsdp", "expert", "tensor")
OPTIONAL_AXES = ("expert",)  # in the mesh only when asked for, so dense meshes keep three axes

# Default placement: FSDP over the model dim, tensor parallelism over heads / ffn / vocab, layers
# replicated (they are scanned), the batch over data x fsdp, experts over the expert axis.
DEFAULT_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "layers": (),
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "mlp": ("tensor",),
    "experts": ("expert",),
}

Rules = Mapping[str, tuple[str, ...]]


def initialize_distributed() -> None:
  """Multi-host start-up; entry points call this first. launchers/tpu_pod.sh sets
  SPADE_DISTRIBUTED=1 on every host, and JAX discovers the slice's coordinator itself."""
  if os.environ.get("SPADE_DISTRIBUTED") == "1":
    jax.distributed.initialize()


def mesh_axes(shape: Mapping[str, int]) -> tuple[str, ...]:
  """The axes of a mesh of this shape: the three fixed ones, plus "expert" when named."""
  return tuple(a for a in MESH_AXES if a not in OPTIONAL_AXES or a in shape)


def make_mesh(shape: Mapping[str, int], devices=None) -> Mesh:
  """A ("data", "fsdp", "tensor") mesh, with "expert" before "tensor" when `shape` names it. One
  size may be -1: it takes the remaining devices; without a -1 the mesh uses the first
  prod(sizes) devices."""
  devices = list(jax.devices() if devices is None else devices)
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"unknown mesh axes {sorted(unknown)}; the mesh axes are {MESH_AXES}")
  axes = mesh_axes(shape)
  sizes = [int(shape.get(a, 1)) for a in axes]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes must be positive with at most one -1, got {dict(shape)}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"mesh {dict(shape)} cannot be filled from {len(devices)} devices")
    sizes[sizes.index(-1)] = len(devices) // known
  n = math.prod(sizes)
  if n > len(devices) or (-1 in [int(shape.get(a, 1)) for a in axes] and n != len(devices)):
    raise ValueError(f"mesh {dict(zip(axes, sizes))} needs {n} devices, "
                     f"but {len(devices)} are available")
  # Fully explicit sizes may ask for fewer devices than there are: the first n are used.
  return Mesh(np.asarray(devices[:n]).reshape(sizes), axes)


def spec_for(axes: tuple[str, ...], rules: Rules, shape: tuple[int, ...] | None = None,
             mesh: Mesh | None = None, what: str = "array") -> P:
  """PartitionSpec for an array whose dims have the given logical names (on `mesh`: without the
  mesh axes it lacks, which have size 1)."""
  parts = []
  used: set[str] = set()
  for dim, name in enumerate(axes):
    if name not in rules:
      raise KeyError(f"{what}: logical axis {name!r} has no sharding rule; rules cover "
                     f"{sorted(rules)}")
    mesh_axes = tuple(rules[name])
    if mesh is not None:
      mesh_axes = tuple(a for a in mesh_axes if a in mesh.shape)
    for a in mesh_axes:
      if a not in MESH_AXES:
        raise ValueError(f"rule {name!r} -> {mesh_axes} names unknown mesh axis {a!r}")
      if a in used:
        raise ValueError(f"{what}: mesh axis {a!r} is used by two dims of {axes}")
      used.add(a)
    if shape is not None and mesh is not None:
      n = math.prod(mesh.shape[a] for a in mesh_axes)
      if shape[dim] % n:
        raise ValueError(f"{what}: dim {dim} ({name!r}, size {shape[dim]}) is not divisible by "
                         f"mesh axes {mesh_axes} of total size {n}; change the mesh or the rule")
    parts.append(mesh_axes[0] if len(mesh_axes) == 1 else (mesh_axes or None))
  return P(*parts)


def param_shardings(cfg: model_lib.ModelConfig, mesh: Mesh, rules: Rules) -> Any:
  """NamedSharding for every parameter, from the abstract (never allocated) parameter shapes."""
  abstract = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.key(0)))
  axes = model_lib.logical_axes(cfg)
  flat_abs, flat_axes = model_lib.flatten(abstract), model_lib.flatten(axes)
  return model_lib.nest({
      path: NamedSharding(mesh, spec_for(flat_axes[path], rules, a.shape, mesh, path))
      for path, a in flat_abs.items()
  })


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int = 2) -> NamedSharding:
  """Batch-major arrays ([B, ...]): batch over the "batch" rule, other dims replicated."""
  return NamedSharding(mesh, P(spec_for(("batch",), rules, mesh=mesh)[0], *([None] * (ndim - 1))))


def batch_shards(mesh: Mesh, rules: Rules) -> int:
  """How many ways the batch dim is split: the product of the mesh axes of the "batch" rule."""
  return math.prod(mesh.shape.get(a, 1) for a in rules["batch"])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def init_sharded(cfg: model_lib.ModelConfig, key: jax.Array, mesh: Mesh, rules: Rules):
  """Random parameters created directly in their shardings (no full copy on one device)."""
  shardings = param_shardings(cfg, mesh, rules)
  return jax.jit(lambda k: model_lib.init_params(cfg, k), out_shardings=shardings)(key)


def place(host_array: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """Puts a host array onto the mesh, each device receiving only its own slice."""
  return jax.make_array_from_callback(host_array.shape, sharding, lambda idx: host_array[idx])


def place_tree(flat_host: Mapping[str, Callable[[], np.ndarray]], shardings) -> Any:
  """Materialises host arrays one at a time (each from a thunk) straight into their shardings."""
  flat_sh = model_lib.flatten(shardings)
  return model_lib.nest({path: place(flat_host[path](), flat_sh[path]) for path in flat_sh})
