"""Chat rendering and incremental multi-turn transcripts with an assistant-only loss mask."""

import pytest

from spade_jax import gguf_io
from spade_jax import tokenizer as tok_lib


@pytest.fixture(scope="module")
def tok():
  return tok_lib.load_tokenizer(gguf_io.embedded_gguf_path("smollm2-135m"))


def test_stop_tokens(tok):
  assert tok.convert_ids_to_tokens(list(tok_lib.stop_token_ids(tok))) == [
      "<|endoftext|>", "<|im_end|>"]


def test_incremental_transcript_equals_full_render(tok):
  msgs = [{"role": "user", "content": "You are in a maze. Act in \\boxed{}."},
          {"role": "assistant", "content": "I go \\boxed{north}."},
          {"role": "user", "content": "A wall. Reward 0."},
          {"role": "assistant", "content": "Then \\boxed{east}."}]
  end = tok.convert_tokens_to_ids("<|im_end|>")
  a1 = tok_lib.encode(tok, msgs[1]["content"]) + [end]
  a2 = tok_lib.encode(tok, msgs[3]["content"]) + [end]

  t = tok_lib.start(tok, msgs[:1])
  t = tok_lib.add_assistant(t, a1)
  t = tok_lib.add_user(tok, t, msgs[2]["content"], a1)
  t = tok_lib.add_assistant(t, a2)

  full = tok_lib.encode(tok, tok_lib.render(tok, msgs, add_generation_prompt=False))
  assert list(t.tokens) == full[:len(t)]
  assert tok.decode(full[len(t):]) == "\n"  # the template's newline after the final <|im_end|>
  assert len(t.mask) == len(t.tokens)
  trained = [tok_id for tok_id, m in zip(t.tokens, t.mask) if m]
  assert trained == a1 + a2
  # The mask is 1 on exactly the two assistant spans.
  start1 = len(tok_lib.start(tok, msgs[:1]))
  assert t.mask[start1 - 1] == 0 and t.mask[start1:start1 + len(a1)] == (1,) * len(a1)


def test_user_turn_after_length_cut_closes_the_turn(tok):
  cut = tok_lib.encode(tok, "I think the answer is")  # no stop token: cut by max tokens
  ids = tok_lib.user_turn_tokens(tok, "Observation.", cut)
  assert tok.convert_ids_to_tokens(ids[0]) == "<|im_end|>"
  assert tok.decode(ids).endswith("<|im_start|>assistant\n")
  stopped = tok_lib.user_turn_tokens(tok, "Observation.", cut + [tok.convert_tokens_to_ids(
      "<|im_end|>")])
  assert stopped == ids[1:]


def test_no_chat_template_is_a_clear_error(tok):
  class Plain:
    chat_template = None
  with pytest.raises(ValueError, match="no chat template"):
    tok_lib.render(Plain(), [{"role": "user", "content": "hi"}])
