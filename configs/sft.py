"""The warm start: supervised fine-tuning on solution transcripts and designer examples.

Presets (`--config=configs/sft.py:PRESET`):

  local     the embedded SmolLM2-135M on 2 CPU cores, about 9 minutes; teaches the protocol
            (read the observation, answer with a short line and one \\boxed{action}):
              python -m spade_jax.sft --config=configs/sft.py:local --workdir=/tmp/sft
              python -m spade_jax.train --config=configs/spade.py:local \\
                  --config.model=/tmp/sft/checkpoints --workdir=/tmp/spade
  qwen3_4b  the same data mix at the scale of the paper's backbones; give the HF directory:
              python -m spade_jax.sft --config=configs/sft.py:qwen3_4b \\
                  --config.model=/data/Qwen3-4B --workdir=/data/sft_qwen3_4b

Agent examples are environments played in the sandbox with their own `solution()` actions (won
plays only, cut at `data.max_turns`), rendered as the self-play agent sees them; designer
examples are the designer's prompt answered with a complete program. Sources: the starter
environments and, once `spade_jax.sandbox.families` exists, its parameterised families at
`data.levels`; `data.dirs` adds directories of programs. `sandbox/heldout/` is never a source.
Rerunning the same command on the same workdir resumes; a finished run is not rerun.
"""

import ml_collections

from spade_jax import config as config_lib
from spade_jax.sandbox import pool as sandbox_pool

PRESETS = {
    "local": "the embedded SmolLM2-135M on CPU: about 9 minutes on 2 cores",
    "qwen3_4b": "the same mix for Qwen3-4B (bfloat16, FSDP); needs --config.model=HF_DIR",
}


def get_config(arg=None):
  preset = arg or "local"
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.model = "smollm2-135m"  # SPEC: embedded name, HF directory, .gguf, checkpoint, random:PRESET
  c.tokenizer = ""  # SPEC to take the tokenizer from; "" = the model's own (random:* need one)
  c.dtype = "float32"  # compute dtype (params and optimizer stay float32)
  c.seed = 0
  c.mesh = config_lib.mesh_config()
  c.rules = config_lib.rules_config()

  c.data = ml_collections.ConfigDict(dict(
      starters=True,  # the hand-written starter environments (sandbox/starters)
      families=True,  # spade_jax.sandbox.families rendered at `levels`, when the package exists
      levels=(1, 2, 3),
      dirs=(),  # more directories of .py environment programs (never sandbox/heldout)
      seeds_per_env=16,  # reset seeds played with solution() per program; won plays are kept
      max_turns=25,  # agent turns per transcript (the agent's limit); longer solutions dropped
      max_len=2048,  # tokens per agent example; longer ones are dropped (counted)
      reasoning="I will try {action}.",  # the line before \boxed{action}; names {action} once
      # Designer examples as a share of all examples: designer prompt -> complete program, over
      # the distinct programs of the sources (each once before any repeats).
      designer_share=0.2,
      designer_memory="mixed",  # the prompt's memory block: empty | starter | mixed (half each)
      designer_max_len=16384,  # tokens per designer example; longer ones are dropped (counted)
      min_turns=3,  # the designer prompt's required interactions (train's env.min_turns)
  ))
  # The designer prompts' documents: a JSONL file with a `text` field, or the built-in corpus.
  c.corpus = ml_collections.ConfigDict(dict(path="", builtin=True, max_words=6000))
  c.env = ml_collections.ConfigDict(dict(
      workers=2,  # sandbox zygote processes
      step_timeout_s=5.0,
      memory_mb=1024,
      require=tuple(sandbox_pool.DEFAULT_REQUIRE),
  ))

  c.epochs = 1
  c.max_steps = 0  # stop after this many optimizer steps (0 = all epochs): a shortened run
  c.batch = 16  # examples per optimizer step (rows grouped by similar length)
  c.length_multiple = 64  # rows are padded to `batch.length_bucket(longest, length_multiple)`
  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-5, weight_decay=0.1, b1=0.9, b2=0.98, eps=1e-8, grad_clip=1.0,
      micro_batch=0,  # rows per gradient-accumulation step; 0 = the whole batch
      chunk=256, remat=True, share_prefix=True))
  c.checkpoint_every = 50  # optimizer steps between checkpoints (and at the end)
  c.keep_checkpoints = 1

  if preset == "local":  # 2 CPU cores: short transcripts, few long designer rows
    c.dtype = "bfloat16"
    c.mesh.data = 1
    c.data.seeds_per_env = 6
    c.data.max_turns = 6
    c.data.max_len = 512
    c.length_multiple = 256  # buckets 256, 384, 512 (and 1536): one compile each
    c.data.designer_share = 0.03
    c.data.designer_memory = "empty"
    c.data.designer_max_len = 1536
    c.corpus.max_words = 60
    c.batch = 8
    c.optim.lr = 5e-5
    c.optim.remat = False
    c.checkpoint_every = 1000  # only at the end: a save of 135M params + Adam takes a while
  elif preset == "qwen3_4b":
    c.model = ""  # required: --config.model=/path/to/Qwen3-4B
    c.dtype = "bfloat16"
    c.mesh.data, c.mesh.fsdp = 1, -1
    c.data.seeds_per_env = 32
    c.data.levels = (1, 2, 3, 4, 5)
    c.epochs = 2
    c.batch = 64
    c.optim.micro_batch = 8
  else:
    raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
  return c
