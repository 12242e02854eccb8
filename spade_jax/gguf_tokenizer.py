"""Tokenizers built from a GGUF file's own vocabulary metadata, without torch.

transformers converts a GGUF vocabulary itself (`AutoTokenizer.from_pretrained(dir, gguf_file=)`),
but its GGUF reader imports torch, which only the test extras install. Here the `tokenizer.*`
metadata is read directly and turned into the `tokenizers.Tokenizer` that conversion builds:
byte-level BPE for `tokenizer.ggml.model` "gpt2" (pre-tokenizer chosen by `tokenizer.ggml.pre`)
and SentencePiece-style BPE with byte fallback for "llama". It is wrapped in
`transformers.PreTrainedTokenizerFast`, so callers keep the usual API (chat template, decode,
special tokens). tests/test_gguf_tokenizer.py holds both to the same ids, text and vocabulary.
"""

from __future__ import annotations

import mmap
import os
import struct

import gguf

# Architectures whose GGUF tokenizers transformers builds with the two builders below (it has
# other builders for e.g. gemma and phi3); these are the ones spade_jax loads.
ARCHITECTURES = ("llama", "qwen2", "qwen3")

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> the regex that splits text before byte-level BPE; None is GPT-2's own
# regex (ByteLevel's built-in). transformers uses GPT-2's for every name it does not list; we
# name those we accept. Note "smollm": llama.cpp also isolates every digit there, transformers
# does not (text like "x  1" differs), and we keep transformers' tokenization.
PRE_TOKENIZER_SPLITS = {
    "default": None, "gpt-2": None, "smollm": None,
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"),
                    _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}

_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (llama.cpp's)
_SCALAR_FORMATS = {
    gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b", gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT16: "H", gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.UINT64: "Q",
    gguf.GGUFValueType.INT64: "q", gguf.GGUFValueType.FLOAT64: "d",
}


def _error(path: str, problem: str):
  # Imported here: spade_jax.convert pulls in JAX, which building a tokenizer does not need.
  from spade_jax.convert import CheckpointError

  return CheckpointError(f"{path}: {problem}")


def read_metadata(path: str) -> dict:
  """The key/value section of a little-endian GGUF v2/v3 file; the tensor table is not read.

  gguf.GGUFReader parses the same fields into one numpy view per array element, which takes
  about 5 s for a 49k-token vocabulary; walking the section with struct takes ~0.1 s.
  """
  if not os.path.exists(path):
    raise _error(path, "no such file")
  try:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      magic, version, _, count = struct.unpack_from("<IIQQ", buf, 0)
      if magic != gguf.GGUF_MAGIC:
        raise ValueError("bad magic")
      if version not in gguf.READER_SUPPORTED_VERSIONS:
        raise ValueError(f"GGUF version {version} is not supported")
      pos, meta = 24, {}
      for _ in range(count):
        key, pos = _read_string(buf, pos)
        (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        meta[key], pos = _read_value(buf, pos, kind)
      return meta
  except (OSError, ValueError, struct.error) as e:  # a truncated file ends in struct.error
    raise _error(path, f"not a readable GGUF file ({type(e).__name__}: {e})") from None


def _read_string(buf, pos: int) -> tuple[str, int]:
  (n,) = struct.unpack_from("<Q", buf, pos)
  if pos + 8 + n > len(buf):  # a slice past the end would just come back short
    raise ValueError(f"a string at byte {pos} runs past the end of the file")
  return buf[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n


def _read_value(buf, pos: int, kind: int):
  if kind in _SCALAR_FORMATS:
    fmt = "<" + _SCALAR_FORMATS[kind]
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
  if kind == gguf.GGUFValueType.STRING:
    return _read_string(buf, pos)
  if kind != gguf.GGUFValueType.ARRAY:
    raise ValueError(f"unknown metadata value type {kind}")
  item, n = struct.unpack_from("<IQ", buf, pos)
  pos += 12
  if item in _SCALAR_FORMATS:
    fmt = f"<{n}{_SCALAR_FORMATS[item]}"
    return list(struct.unpack_from(fmt, buf, pos)), pos + struct.calcsize(fmt)
  read = _read_string if item == gguf.GGUFValueType.STRING else (
      lambda b, p: _read_value(b, p, item))
  values = []
  for _ in range(n):
    value, pos = read(buf, pos)
    values.append(value)
  return values, pos


def _byte_spelling() -> dict[int, str]:
  """GPT-2's byte -> character map: printable Latin-1 bytes spell themselves, the other 68 take
  the characters from U+0100 on, so every byte string is a printable string."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
               *range(ord("®"), ord("ÿ") + 1)]
  others = [b for b in range(256) if b not in printable]
  return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def _merges(meta: dict, tokens: list[str], path: str) -> list[tuple[str, str]]:
  if "tokenizer.ggml.merges" in meta:
    pairs = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    bad = next((m for m in pairs if len(m) != 2), None)
    if bad is not None:
      raise _error(path, f"merge {' '.join(bad)!r} is not two tokens")
    return pairs
  if "tokenizer.ggml.scores" not in meta:
    raise _error(path, "the vocabulary has neither merges nor scores to derive them from")
  return merges_from_scores(tokens, meta["tokenizer.ggml.scores"])


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
  """The BPE merges a SentencePiece vocabulary implies (Llama-2-style files store none).

  Every split of a piece into two pieces of the vocabulary is a merge ranked by the piece's
  score, best first; ties go to the shorter left, then right part, then vocabulary order. This
  is the ranking transformers derives, so both tokenizers merge alike.
  """
  ids = {t: i for i, t in enumerate(tokens)}
  found = []
  for piece, score in dict(zip(tokens, scores)).items():
    splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
              if piece[:k] in ids and piece[k:] in ids]
    splits.sort(key=lambda lr: (ids[lr[0]], ids[lr[1]]))
    found += [(score, left, right) for left, right in splits]
  found.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)  # stable: order kept
  return [(left, right) for _, left, right in found]


def _byte_level_bpe(meta: dict, tokens: list[str], path: str):
  """GPT-2-style BPE over bytes spelled as characters; returns (tokenizer, vocab, alphabet)."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZER_SPLITS:
    raise _error(path, f"tokenizer.ggml.pre {pre!r} is not supported; supported: "
                       f"{sorted(PRE_TOKENIZER_SPLITS)}")
  spelling = _byte_spelling()
  alphabet = set(spelling.values())
  # A file may store a token raw (e.g. an added "<think>" with a space); the BPE model needs it
  # spelled in the byte alphabet like every other entry.
  vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
           for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, tokens, path), dropout=None,
                             continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
  split = PRE_TOKENIZER_SPLITS[pre]
  if split is None:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  else:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  return tok, vocab, alphabet


def _sentencepiece_bpe(meta: dict, tokens: list[str], path: str):
  """Llama-style BPE over "▁"-for-space text, with <0xNN> tokens for bytes outside the vocab.

  A "▁" is prepended to the first piece only, whatever tokenizer.ggml.add_space_prefix says:
  transformers' conversion ignores that flag, and matching it keeps the ids the same.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers

  vocab = {t: i for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, tokens, path), dropout=None,
                             fuse_unk=True, byte_fallback=True))
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                               split=False)
  tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(content=" ", left=1)])
  return tok, vocab, None


BUILDERS = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}


def build_backend(meta: dict, path: str):
  """The `tokenizers.Tokenizer` of a GGUF's metadata (`read_metadata`), added tokens included."""
  from tokenizers import AddedToken

  arch, model = meta.get("general.architecture"), meta.get("tokenizer.ggml.model")
  if arch not in ARCHITECTURES:
    raise _error(path, f"GGUF architecture {arch!r}: tokenizers are built for "
                       f"{list(ARCHITECTURES)} only")
  if model not in BUILDERS:
    raise _error(path, f"tokenizer.ggml.model {model!r} is not supported; supported: "
                       f"{sorted(BUILDERS)}")
  tokens = meta.get("tokenizer.ggml.tokens")
  if not tokens:
    raise _error(path, "no tokenizer.ggml.tokens in the metadata")
  tok, vocab, alphabet = BUILDERS[model](meta, tokens, path)
  kinds = meta.get("tokenizer.ggml.token_type") or []
  # Control tokens (<|im_end|>) are matched whole and are special; a byte-level one outside the
  # byte alphabet is skipped, as transformers does (llama.cpp mislabels such tokens).
  control = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, kinds)
             if k == _CONTROL and (alphabet is None or set(t) <= alphabet)]
  tok.add_special_tokens(control)
  # User-defined tokens (<think>) are matched whole too, but are ordinary text.
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t, k in zip(tokens, kinds) if k == _USER_DEFINED and t in vocab])
  return tok


def _special_token(meta: dict, name: str, tokens: list[str], path: str) -> str | None:
  index = meta.get(f"tokenizer.ggml.{name}_token_id")
  if index is None:
    return None
  if not 0 <= index < len(tokens):
    raise _error(path, f"tokenizer.ggml.{name}_token_id {index} is outside the vocabulary "
                       f"({len(tokens)} tokens)")
  return tokens[index]


def build_tokenizer(path: str):
  """A `transformers.PreTrainedTokenizerFast` for a .gguf file, as transformers' own GGUF
  conversion would build it (same ids, decoding, vocabulary, special tokens, chat template)."""
  from transformers import PreTrainedTokenizerFast

  meta = read_metadata(path)
  backend = build_backend(meta, path)
  tokens = meta["tokenizer.ggml.tokens"]
  # A SentencePiece file without the flag gets BOS, as llama.cpp does.
  add_bos = meta.get("tokenizer.ggml.add_bos_token", meta["tokenizer.ggml.model"] == "llama")
  tok = PreTrainedTokenizerFast(
      tokenizer_object=backend, name_or_path=path,
      bos_token=_special_token(meta, "bos", tokens, path),
      eos_token=_special_token(meta, "eos", tokens, path),
      unk_token=_special_token(meta, "unknown", tokens, path),
      pad_token=_special_token(meta, "padding", tokens, path),
      add_bos_token=bool(add_bos), add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token")),
      chat_template=meta.get("tokenizer.chat_template"))
  # A special token spelled unlike its vocabulary entry would become a new id the model has no
  # embedding for (transformers does that silently); refuse instead.
  if tok.backend_tokenizer.get_vocab_size(True) > backend.get_vocab_size(False):
    extra = sorted(set(tok.get_vocab()) - set(backend.get_vocab(with_added_tokens=False)))
    raise _error(path, f"special tokens {extra} are not in the vocabulary as spelled")
  return tok
