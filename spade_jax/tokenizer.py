"""Tokenizers and chat transcripts with a loss mask on exactly the assistant-generated tokens.

SPADE trains one sequence per episode (docs/method.md §4): the chat prompt, then alternating assistant
turns (the sampler's tokens, verbatim) and environment observations (user turns). `Transcript`
builds that sequence incrementally: assistant tokens are appended as sampled, never re-tokenized,
and each user turn appends only the template text that follows the assistant's end-of-turn token.
The loss mask is 1 on assistant tokens and 0 on everything the template or the environment wrote.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from spade_jax import gguf_tokenizer

Message = dict[str, str]

_SENTINEL = "\u2063SPADE_ASSISTANT_TURN\u2063"


def load_tokenizer(path: str):
  """The tokenizer of an HF directory (AutoTokenizer) or of a .gguf file.

  A .gguf vocabulary is built from the file's own metadata by `gguf_tokenizer` (well under a
  second for SmolLM2's 49k tokens, so nothing is cached): transformers' GGUF conversion gives the
  same tokenizer but imports torch, which the runtime does not install.
  """
  # Imported without torch, transformers advises that "PyTorch was not found"; only its
  # tokenizers are used here, so the advisory is noise (a user's own setting wins).
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  if path.endswith(".gguf"):
    return gguf_tokenizer.build_tokenizer(path)
  from transformers import AutoTokenizer

  return AutoTokenizer.from_pretrained(path)


def stop_token_ids(tokenizer) -> tuple[int, ...]:
  """Token ids that end an assistant turn: EOS plus the chat end-of-turn markers in the vocab."""
  ids = set()
  if tokenizer.eos_token_id is not None:
    ids.add(int(tokenizer.eos_token_id))
  vocab = tokenizer.get_vocab()
  for marker in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
    if marker in vocab:
      ids.add(int(vocab[marker]))
  return tuple(sorted(ids))


def render(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("this tokenizer has no chat template; use a plain prompt instead of --chat")
  return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                       add_generation_prompt=add_generation_prompt)


def encode(tokenizer, text: str) -> list[int]:
  """Tokens of rendered text; the template already wrote any BOS, so none is added."""
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _user_turn_text(tokenizer, user: str) -> str:
  """Template text from the end of an assistant turn's content through the next generation
  prompt, e.g. "<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n"."""
  msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL},
          {"role": "user", "content": user}]
  text = render(tokenizer, msgs, add_generation_prompt=True)
  if text.count(_SENTINEL) != 1:
    raise ValueError("the chat template does not reproduce assistant content verbatim")
  return text.split(_SENTINEL, 1)[1]


@dataclasses.dataclass(frozen=True)
class Transcript:
  """A training sequence under construction: tokens, the 0/1 loss mask and the behaviour
  log-prob of each trained token (0 elsewhere), all the same length."""

  tokens: tuple[int, ...] = ()
  mask: tuple[int, ...] = ()
  logp: tuple[float, ...] = ()

  def __len__(self) -> int:
    return len(self.tokens)

  def add(self, tokens: Sequence[int], trained: bool,
          logp: Sequence[float] | None = None) -> "Transcript":
    tokens = tuple(int(t) for t in tokens)
    if logp is None:
      logp = (0.0,) * len(tokens)
    elif not trained or len(logp) != len(tokens):
      raise ValueError("log-probs go with trained tokens, one per token")
    return Transcript(self.tokens + tokens, self.mask + (int(trained),) * len(tokens),
                      self.logp + tuple(float(x) for x in logp))


def start(tokenizer, messages: Sequence[Message]) -> Transcript:
  """The first prompt (system/user turns + generation prompt), mask 0."""
  return Transcript().add(encode(tokenizer, render(tokenizer, messages)), trained=False)


def add_assistant(t: Transcript, tokens: Sequence[int],
                  logp: Sequence[float] | None = None) -> Transcript:
  """Sampled assistant tokens, verbatim (including a final stop token if one was sampled), with
  the sampler's log-prob of each."""
  return t.add(tokens, trained=True, logp=logp)


def reply_tokens(tokenizer, messages: Sequence[Message], reply: str) -> list[int]:
  """The tokens of `reply` as the model writes it after the generation prompt of `messages`:
  the template's rendering of the assistant turn, through its end-of-turn stop token (the
  sampler stops there too). Used to replay a given reply as if it had been sampled."""
  prompt = render(tokenizer, messages)
  full = render(tokenizer, list(messages) + [{"role": "assistant", "content": reply}],
                add_generation_prompt=False)
  if not full.startswith(prompt):
    raise ValueError("the chat template does not continue its generation prompt with the "
                     "assistant turn; cannot replay a reply")
  ids = encode(tokenizer, full[len(prompt):])
  stops = set(stop_token_ids(tokenizer))
  ends = [i for i, t in enumerate(ids) if t in stops]
  if ends:
    return ids[:ends[0] + 1]
  return ids + ([int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else [])


def user_turn_tokens(tokenizer, user: str, assistant_tokens: Sequence[int]) -> list[int]:
  """Tokens that follow an assistant turn and open the next one, with `user` in between.

  If the assistant turn ended with a stop token, the template's own end-of-turn marker is that
  token and is not repeated; if it was cut by a length limit, the marker is inserted here.
  """
  text = _user_turn_text(tokenizer, user)
  stops = stop_token_ids(tokenizer)
  if assistant_tokens and int(assistant_tokens[-1]) in stops:
    ended = tokenizer.convert_ids_to_tokens(int(assistant_tokens[-1]))
    if text.startswith(ended):
      text = text[len(ended):]
  return encode(tokenizer, text)


def add_user(tokenizer, t: Transcript, user: str, assistant_tokens: Sequence[int]) -> Transcript:
  """Appends an observation as a user turn plus the next generation prompt, mask 0."""
  return t.add(user_turn_tokens(tokenizer, user, assistant_tokens), trained=False)
