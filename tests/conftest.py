"""Test setup: 8 fake CPU devices (set before JAX starts), shared fixtures.

Tests that need several devices build meshes over these 8 CPU devices, so sharding really
happens; single-device tests use `jax.devices()[:1]`.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2():
  """The embedded SmolLM2-135M (GGUF, dequantized), loaded once for the whole run."""
  from spade_jax import loading

  return loading.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_hf():
  """transformers' SmolLM2-135M from the same GGUF file, float32, eval mode."""
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM

  from spade_jax import gguf_io

  path = gguf_io.embedded_gguf_path("smollm2-135m")
  m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                           gguf_file=os.path.basename(path), dtype=torch.float32)
  return m.eval()
