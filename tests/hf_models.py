"""Tiny random transformers models for parity tests (built in the test, saved as HF dirs)."""

import numpy as np
import torch
import transformers

# Odd sizes on purpose: GQA with 3 query heads per kv head, non-power-of-two dims.
TINY = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
            num_attention_heads=6, num_key_value_heads=2, head_dim=12,
            max_position_embeddings=128, rms_norm_eps=1e-5)

CONFIGS = {
    "llama_untied": lambda: transformers.LlamaConfig(**TINY, rope_theta=500.0,
                                                     tie_word_embeddings=False),
    "llama_tied": lambda: transformers.LlamaConfig(**TINY, rope_theta=10000.0,
                                                   tie_word_embeddings=True),
    "qwen3_tied": lambda: transformers.Qwen3Config(**TINY, rope_theta=1e6,
                                                   tie_word_embeddings=True),
    "qwen3_untied": lambda: transformers.Qwen3Config(**TINY, rope_theta=1e4,
                                                     tie_word_embeddings=False),
    "qwen2_bias": lambda: transformers.Qwen2Config(**TINY, rope_theta=1e4,
                                                   tie_word_embeddings=False),
}


def build(name, seed: int = 0):
  """A random float32 transformers model (of a CONFIGS name, or a config) whose norms and biases
  are also random (so that a dropped norm weight or bias would show in the logits)."""
  torch.manual_seed(seed)
  cfg = CONFIGS[name]() if isinstance(name, str) else name
  cls = transformers.AutoModelForCausalLM
  m = cls.from_config(cfg, dtype=torch.float32).eval()
  with torch.no_grad():
    for n, p in m.named_parameters():
      if n.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif n.endswith(".bias"):
        p.copy_(0.2 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  return m


def logits(m, tokens) -> np.ndarray:
  with torch.no_grad():
    return m(torch.as_tensor(tokens)).logits.float().numpy()


# Qwen3-MoE: experts of an odd width, a dense layer among sparse ones (mlp_only_layers) or every
# other layer dense (decoder_sparse_step), norm_topk_prob both ways.
TINY_MOE = dict(TINY, moe_intermediate_size=20, num_experts=7, num_experts_per_tok=3)

MOE_CONFIGS = {
    "moe_norm_dense_mid": lambda: transformers.Qwen3MoeConfig(
        **TINY_MOE, rope_theta=1e6, norm_topk_prob=True, mlp_only_layers=[1],
        tie_word_embeddings=False),
    "moe_raw_step2": lambda: transformers.Qwen3MoeConfig(
        **dict(TINY_MOE, num_hidden_layers=4), rope_theta=1e4, norm_topk_prob=False,
        decoder_sparse_step=2, tie_word_embeddings=True),
}
CONFIGS.update(MOE_CONFIGS)
