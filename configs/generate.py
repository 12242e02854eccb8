"""Text or chat generation with any model SPEC (embedded, HF directory, .gguf, checkpoint).

Run (the embedded SmolLM2-135M-Instruct, on CPU, in about a minute):

  python -m spade_jax.generate --model smollm2-135m --chat --prompt "Name three prime numbers."

The short flags set fields of this config; any field can also be set directly, e.g.

  python -m spade_jax.generate --config=configs/generate.py --config.model=/ckpt/Qwen3-4B \
      --config.dtype=bfloat16 --config.mesh.tensor=4 --chat --prompt "..."

`arg` is unused; it exists so every config file has the same get_config(arg) signature.
"""

import ml_collections

from spade_jax import config as config_lib


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.model = "smollm2-135m"  # SPEC: embedded name, HF dir, .gguf file, checkpoint dir, random:PRESET
  c.dtype = "float32"  # compute dtype; params are float32
  c.prompt = ""
  c.chat = False  # render the prompt as one user turn with the model's chat template
  c.greedy = False
  c.temperature = 0.6
  c.top_p = 0.95
  c.top_k = 20  # 0 disables top-k
  c.max_new_tokens = 128
  c.num_samples = 1
  c.seed = 0
  c.mesh = config_lib.mesh_config()
  c.rules = config_lib.rules_config()
  return c
