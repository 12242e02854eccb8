"""GGUF tokenizers built from metadata: the same as transformers' own GGUF conversion, no torch.

Parity runs on the embedded SmolLM2 file (byte-level BPE, "smollm" pre-tokenizer) and on tiny
files written here: byte-level BPE vocabularies with Qwen2's and Llama 3's pre-tokenizers, and a
SentencePiece-style vocabulary with byte-fallback tokens and no merges (they are derived from
the scores). The vocabularies are trained on the spot with `tokenizers`, so they are real BPE
vocabularies; both tokenizers read the same file, so only agreement is asserted.
"""

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from spade_jax import gguf_io
from spade_jax import gguf_tokenizer
from spade_jax import tokenizer as tok_lib
from spade_jax.convert import CheckpointError

TEXTS = [
    "", " ", "Hello, world!", "Café naïve résumé, déjà vu — Ærøskøbing", "日本語のテキストと中文字符",
    "emoji 😀🎉 👍🏽 family 👨‍👩‍👧 flag 🇫🇷", "e\u0301 a\u0300 n\u0303 combining marks", "مرحبا بالعالم",
    "שָׁלוֹם עולם", "def f(x):\n\tif x:\n\t\treturn x  # tab\n    else:\n        return -1\n",
    "a  b   c    d     e", "\n", "\n\n\n", " \n \n  \n", "   leading", "trailing   ", "\t \t",
    "0 12 345 6789 3.14159 1,000,000 x  1 a\n\n  3", "I'm they'll we've DON'T it's",
    "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|><|endoftext|>", "<think>plan</think> ok",
    "<s>[INST] x [/INST]</s><unk>", "<|begin_of_text|><|eot_id|>", "<0x41> ▁ Ġ ĊĠ", "\x00\x7f\u200b",
]

MESSAGES = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café? 日本 😀"},
     {"role": "assistant", "content": "Oui.\n\n  Done\t"}, {"role": "user", "content": " 12  3"}],
]

CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{'<|im_start|>assistant\n'}}{% endif %}")
INST = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %} "
        "{{ m['content'] }}{{ eos_token }}{% else %}[INST] {{ m['content'] }} [/INST]"
        "{% endif %}{% endfor %}")
_CORPUS = TEXTS[2:11] + ["the quick brown fox jumps over the lazy dog " * 3,
                         "return self.value if self.value else None\n" * 2]
_QWEN2_SPLIT = gguf_tokenizer.PRE_TOKENIZER_SPLITS["qwen2"]
CONTROL, USER_DEFINED, BYTE, UNKNOWN = 3, 4, 6, 2


def write_gguf(path, arch, model, tokens, types, pre=None, merges=None, scores=None, ids=(),
               add=(), template=None):
  """A metadata-only GGUF (one dummy tensor) with just enough config for transformers."""
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(1)
  w.add_context_length(64)
  w.add_embedding_length(8)
  w.add_feed_forward_length(16)
  w.add_head_count(2)
  w.add_head_count_kv(2)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_tokenizer_model(model)
  if pre is not None:
    w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(types)
  if merges is not None:
    w.add_token_merges(merges)
  if scores is not None:
    w.add_token_scores(scores)
  for name, index in dict(ids).items():
    getattr(w, f"add_{name}_token_id")(index)
  for name, value in dict(add).items():
    getattr(w, f"add_add_{name}_token")(value)
  if template is not None:
    w.add_chat_template(template)
  w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def _train(pre_tokenizer, size, **bpe):
  """(tokens in id order, merges) of a BPE trained on the corpus."""
  t = Tokenizer(models.BPE(**bpe))
  t.pre_tokenizer = pre_tokenizer
  alphabet = pre_tokenizers.ByteLevel.alphabet() if "byte_fallback" not in bpe else []
  t.train_from_iterator(_CORPUS * 3, trainers.BpeTrainer(
      vocab_size=size, initial_alphabet=alphabet, show_progress=False))
  model = json.loads(t.to_str())["model"]
  return sorted(model["vocab"], key=model["vocab"].get), [" ".join(m) for m in model["merges"]]


def byte_level_file(path, arch, pre, split, specials, named=(), **kw):
  """A trained byte-level vocabulary plus `specials` [(token, type)]; `named` maps bos/eos/...
  to one of them. Returns (path, size of the trained part)."""
  pt = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"),
                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  vocab, merges = _train(pt, 420)
  tokens = vocab + [t for t, _ in specials]
  types = [1] * len(vocab) + [k for _, k in specials]
  ids = {name: tokens.index(token) for name, token in dict(named).items()}
  return (write_gguf(path, arch, "gpt2", tokens, types, pre=pre, merges=merges, ids=ids, **kw),
          len(vocab))


def qwen2_file(path):
  specials = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
              ("<think>", USER_DEFINED), ("</think>", USER_DEFINED)]
  named = {"bos": "<|endoftext|>", "eos": "<|im_end|>", "pad": "<|endoftext|>"}
  return byte_level_file(path, "qwen2", "qwen2", _QWEN2_SPLIT, specials, named,
                         add={"bos": False}, template=CHATML)


def sentencepiece_tokens():
  vocab, _ = _train(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                             split=False), 330, byte_fallback=True)
  tokens = (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + vocab
            + ["<tool>"])
  types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [1] * len(vocab) + [USER_DEFINED]
  # Scores fall with the training order, three tokens per score, so derived merges need the
  # tie-break order too.
  scores = [0.0] * 259 + [-float(i // 3) for i in range(len(vocab))] + [0.0]
  return tokens, types, scores


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("gguf")
  tokens, types, scores = sentencepiece_tokens()
  llama3 = [("<|begin_of_text|>", CONTROL), ("<|end_of_text|>", CONTROL), ("<|eot_id|>", CONTROL),
            ("<|endoftext|>", CONTROL)]
  return {
      "smollm2": gguf_io.embedded_gguf_path("smollm2-135m"),
      "qwen2": qwen2_file(d / "qwen2.gguf")[0],
      "llama3": byte_level_file(
          d / "llama3.gguf", "llama", "llama-bpe", gguf_tokenizer.PRE_TOKENIZER_SPLITS["llama3"],
          llama3, {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}, add={"bos": True},
          template=CHATML)[0],
      "sentencepiece": write_gguf(d / "spm.gguf", "llama", "llama", tokens, types, scores=scores,
                                  ids={"bos": 1, "eos": 2, "unk": 0}, template=INST),
  }


_REFERENCE = {}


def transformers_tokenizer(path):
  """transformers' own conversion of the file (needs torch), once per file."""
  pytest.importorskip("torch")
  from transformers import AutoTokenizer

  if path not in _REFERENCE:
    _REFERENCE[path] = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                     gguf_file=os.path.basename(path))
  return _REFERENCE[path]


@pytest.mark.parametrize("name", ["smollm2", "qwen2", "llama3", "sentencepiece"])
def test_same_tokenizer_as_transformers(files, name):
  ref = transformers_tokenizer(files[name])
  ours = gguf_tokenizer.build_tokenizer(files[name])
  assert ours.get_vocab() == ref.get_vocab()
  assert ours.chat_template == ref.chat_template and ours.chat_template
  for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id", "eos_token_id",
               "unk_token_id", "pad_token_id", "all_special_ids", "add_bos_token", "add_eos_token"):
    assert getattr(ours, attr) == getattr(ref, attr), attr
  # The whole pipeline (normalizer, pre-tokenizer, model, merges, added tokens, post-processor,
  # decoder), so texts not listed here tokenize alike too.
  assert (json.loads(ours.backend_tokenizer.to_str())
          == json.loads(ref.backend_tokenizer.to_str()))
  for text in TEXTS:
    for special in (True, False):
      ids = ours(text, add_special_tokens=special)["input_ids"]
      assert ids == ref(text, add_special_tokens=special)["input_ids"], text
    assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids), text
    for skip in (False, True):
      assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
          ids, skip_special_tokens=skip), text


@pytest.mark.parametrize("name", ["smollm2", "qwen2", "sentencepiece"])
def test_same_chat_rendering_as_transformers(files, name):
  ref = transformers_tokenizer(files[name])
  ours = gguf_tokenizer.build_tokenizer(files[name])
  for messages in MESSAGES:
    for prompt in (True, False):
      kw = dict(add_generation_prompt=prompt)
      text = ours.apply_chat_template(messages, tokenize=False, **kw)
      assert text == ref.apply_chat_template(messages, tokenize=False, **kw)
      assert (ours.apply_chat_template(messages, **kw)["input_ids"]
              == ref.apply_chat_template(messages, **kw)["input_ids"])
      assert tok_lib.encode(ours, text) == tok_lib.encode(ref, text)


def test_byte_level_round_trip_and_markers(files):
  tok = tok_lib.load_tokenizer(files["qwen2"])
  for text in TEXTS:
    assert tok.decode(tok(text)["input_ids"]) == text
  ids = tok("<think>x</think><|im_end|>")["input_ids"]
  assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == ["<think>", "<|im_end|>"]
  assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think>"  # user-defined stays


def test_sentencepiece_bos_and_byte_fallback(files):
  tok = tok_lib.load_tokenizer(files["sentencepiece"])
  ids = tok("☃")["input_ids"]  # not in the training corpus
  assert tok.convert_ids_to_tokens(ids) == ["<s>", "▁", "<0xE2>", "<0x98>", "<0x83>"]
  assert tok.decode(ids, skip_special_tokens=True) == "☃"


def test_merges_from_scores_hand_computed():
  tokens = ["a", "b", "c", "ab", "bc", "abc"]
  # ab (-1) and bc (-2) first; abc's two splits tie at -3 and the longer left part wins.
  assert gguf_tokenizer.merges_from_scores(tokens, [0, 0, 0, -1, -2, -3]) == [
      ("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]


def test_metadata_reader_matches_gguf_reader(files):
  for name in ("qwen2", "sentencepiece"):
    ours = gguf_tokenizer.read_metadata(files[name])
    ref = {k: f.contents() for k, f in gguf.GGUFReader(files[name]).fields.items()
           if not k.startswith("GGUF.")}
    assert ours == ref


def test_no_token_beyond_the_file(tmp_path):
  """transformers adds its class's default "<|endoftext|>" when a byte-level vocabulary lacks
  it (an id the model has no row for); ours has exactly the file's tokens."""
  path, n = byte_level_file(tmp_path / "l3.gguf", "llama", "llama-bpe",
                            gguf_tokenizer.PRE_TOKENIZER_SPLITS["llama3"],
                            [("<|begin_of_text|>", CONTROL), ("<|eot_id|>", CONTROL)],
                            {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"})
  tok = gguf_tokenizer.build_tokenizer(path)
  assert len(tok) == n + 2 and sorted(tok.get_vocab().values()) == list(range(n + 2))
  assert tok_lib.stop_token_ids(tok) == (n + 1,)


def test_builds_without_importing_torch():
  code = ("import sys\n"
          "from spade_jax import gguf_io, tokenizer\n"
          "tok = tokenizer.load_tokenizer(gguf_io.embedded_gguf_path('smollm2-135m'))\n"
          "text = tokenizer.render(tok, [{'role': 'user', 'content': 'hi'}])\n"
          "assert tok.decode(tokenizer.encode(tok, text)) == text\n"
          "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]


def test_unsupported_tokenizer_model_is_a_clear_error(tmp_path):
  path = write_gguf(tmp_path / "t5.gguf", "llama", "t5", ["<pad>", "a"], [CONTROL, 1],
                    scores=[0.0, -1.0])
  with pytest.raises(CheckpointError, match=r"t5\.gguf: tokenizer\.ggml\.model 't5'"):
    tok_lib.load_tokenizer(path)


def test_unsupported_pre_tokenizer_is_a_clear_error(tmp_path):
  path = write_gguf(tmp_path / "ds.gguf", "llama", "gpt2", ["a", "b", "ab"], [1, 1, 1],
                    pre="deepseek-llm", merges=["a b"])
  with pytest.raises(CheckpointError, match=r"ds\.gguf: tokenizer\.ggml\.pre 'deepseek-llm'"):
    gguf_tokenizer.build_tokenizer(path)


def test_special_token_missing_from_the_vocabulary_is_an_error(tmp_path):
  # A byte-level control token outside the byte alphabet is stored respelled, so as BOS its raw
  # spelling would become a new id.
  path, n = byte_level_file(tmp_path / "r1.gguf", "qwen2", "qwen2", _QWEN2_SPLIT,
                            [("<｜begin▁of▁sentence｜>", CONTROL)],
                            {"bos": "<｜begin▁of▁sentence｜>"})
  with pytest.raises(CheckpointError, match="not in the vocabulary as spelled"):
    gguf_tokenizer.build_tokenizer(path)


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)  # cut inside the header
  with pytest.raises(CheckpointError, match="bad.gguf: not a readable GGUF file"):
    gguf_tokenizer.build_tokenizer(str(bad))
