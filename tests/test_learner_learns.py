"""It learns: GRPO from a random tiny model solves a toy task that needs the prompt.

The prompt is one token x; the answer is the token (x + 1) mod V; the reward is 1 when it is right,
so a policy that ignores the prompt earns about 1/V. The project's sampler draws the G answers
of each prompt from one prefill; its log-probs follow the shared `logprobs` convention, so the
train step runs on-policy with IS weights of 1.
"""

import time

import jax
import numpy as np

from spade_jax import learner as learner_lib
from spade_jax import rl, sampling, sharding
from spade_jax import model as model_lib

V, ANSWER, G, TEMP, SHIFT = 16, 1, 16, 1.0, 1
PROMPTS = V  # every prompt in every step
CFG = model_lib.PRESETS["tiny"].replace(vocab_size=V)


def reward(tokens):
  """Fraction of answer tokens right."""
  x = tokens[:, 0]
  want = np.stack([(x + SHIFT + i) % V for i in range(ANSWER)], axis=1)
  return (tokens[:, 1:] == want).mean(axis=1)


def test_grpo_learns_prompt_conditioned_task():
  start = time.time()
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  lrn = learner_lib.make_learner(CFG, learner_lib.LearnerConfig(lr=2e-3), mesh)
  state = lrn.init_state(sharding.init_sharded(CFG, jax.random.key(0), mesh,
                                               sharding.DEFAULT_RULES))
  sampler = sampling.Sampler(CFG, mesh)
  settings = sampling.Settings(max_new_tokens=ANSWER, temperature=TEMP, top_k=0, top_p=1.0,
                               ignore_eos=True)
  mask = np.zeros((PROMPTS * G, 1 + ANSWER), np.float32)
  mask[:, 1:] = 1.0
  history = []
  for step in range(100):  # the budget: it converges in a few dozen steps
    out = sampler.generate(state.params, [[x] for x in range(V)], settings, seed=step,
                           num_samples=G)  # row x * G + g: sample g of prompt x
    prompt = np.repeat(np.arange(V), G).astype(np.int32)
    tokens = np.concatenate([prompt[:, None], out.tokens], axis=1)
    logp = np.concatenate([np.zeros((len(prompt), 1), np.float32), out.logprobs], axis=1)
    r = reward(tokens)
    history.append(r.mean())
    if step >= 5 and np.mean(history[-5:]) > 0.95:
      break
    batch = {
        "tokens_BT": tokens, "loss_mask_BT": mask, "logp_behaviour_BT": logp,
        "advantages_B": rl.agent_advantages(r, np.repeat(np.arange(PROMPTS), G)),
        "temperature_B": np.full(len(r), TEMP, np.float32),
    }
    state, m = lrn.train_step(state, batch)
    assert float(m["skipped"]) == 0.0
    np.testing.assert_allclose(m["is_weight_mean"], 1.0, atol=1e-4)  # on-policy
  print(f"steps {step}, reward {history[0]:.3f} -> {np.mean(history[-5:]):.3f}, "
        f"{time.time() - start:.1f}s")
  assert np.mean(history[:3]) < 0.25  # chance is 1/V
  assert np.mean(history[-5:]) > 0.9
