"""Bad checkpoints get a clear error naming the problem, and nothing is placed on a device."""

import json
import os
import shutil

import numpy as np
import pytest

import jax.numpy as jnp

torch = pytest.importorskip("torch")

from spade_jax import loading, model, sharding  # noqa: E402
from spade_jax.hf import CheckpointError  # noqa: E402
from tests import hf_models  # noqa: E402


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("good")
  hf_models.build("llama_untied").save_pretrained(d, safe_serialization=True)
  return str(d)


@pytest.fixture
def ckpt(good_dir, tmp_path):
  d = tmp_path / "ckpt"
  shutil.copytree(good_dir, d)
  return str(d)


@pytest.fixture
def placed(monkeypatch):
  """Counts arrays placed on devices, to prove a failed load placed none."""
  calls = []
  real = sharding.place
  monkeypatch.setattr(sharding, "place", lambda a, s: calls.append(1) or real(a, s))
  return calls


def _rewrite(d, edit):
  from safetensors.numpy import load_file, save_file

  path = os.path.join(d, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path, metadata={"format": "pt"})


def test_good_checkpoint_places_every_param(ckpt, placed):
  loaded = loading.load_model(ckpt, tokenizer=False)
  assert len(placed) == len(model.param_table(loaded.cfg))


def test_sharded_index_checkpoint(tmp_path):
  m = hf_models.build("qwen3_untied")
  m.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  loaded = loading.load_model(str(tmp_path), tokenizer=False)
  tokens = np.arange(10, dtype=np.int32)[None]
  ours = np.asarray(model.forward(loaded.params, jnp.asarray(tokens), loaded.cfg))
  assert np.abs(ours - hf_models.logits(m, tokens)).max() < 1e-4


def test_missing_tensor(ckpt, placed):
  _rewrite(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.mlp.up_proj.weight'"):
    loading.load_model(ckpt, tokenizer=False)
  assert not placed


def test_wrong_shape(ckpt, placed):
  def edit(t):
    t["model.layers.2.self_attn.k_proj.weight"] = np.zeros((24, 47), np.float32)
  _rewrite(ckpt, edit)
  with pytest.raises(CheckpointError, match=r"k_proj.weight' has shape \(24, 47\), expected"):
    loading.load_model(ckpt, tokenizer=False)
  assert not placed


def test_unknown_architecture(ckpt, placed):
  path = os.path.join(ckpt, "config.json")
  c = json.load(open(path))
  c["architectures"], c["model_type"] = ["GPT2LMHeadModel"], "gpt2"
  json.dump(c, open(path, "w"))
  with pytest.raises(CheckpointError, match="unknown architecture.*GPT2LMHeadModel"):
    loading.load_model(ckpt, tokenizer=False)
  assert not placed


def test_unsupported_rope_scaling(ckpt):
  path = os.path.join(ckpt, "config.json")
  c = json.load(open(path))
  c["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
  json.dump(c, open(path, "w"))
  with pytest.raises(CheckpointError, match="rope type 'yarn' is not supported"):
    loading.load_model(ckpt, tokenizer=False)


def test_truncated_safetensors(ckpt, placed):
  path = os.path.join(ckpt, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size - 1000)
  with pytest.raises(CheckpointError, match="truncated"):
    loading.load_model(ckpt, tokenizer=False)
  assert not placed


def test_corrupt_safetensors_header(ckpt, placed):
  path = os.path.join(ckpt, "model.safetensors")
  with open(path, "r+b") as f:
    f.seek(8)
    f.write(b"\xff\x00garbage")
  with pytest.raises(CheckpointError, match="corrupt safetensors header"):
    loading.load_model(ckpt, tokenizer=False)
  assert not placed


def test_index_naming_a_missing_shard(tmp_path):
  hf_models.build("llama_tied").save_pretrained(tmp_path, max_shard_size="20KB")
  shard = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))[0]
  os.remove(tmp_path / shard)
  with pytest.raises(CheckpointError, match=f"names {shard}, which is missing"):
    loading.load_model(str(tmp_path), tokenizer=False)


def test_gguf_of_unsupported_architecture(tmp_path, placed):
  import gguf

  path = str(tmp_path / "gpt2.gguf")
  w = gguf.GGUFWriter(path, "gpt2")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(CheckpointError, match="GGUF architecture 'gpt2' is not supported"):
    loading.load_model(path, tokenizer=False)
  assert not placed


def test_not_a_gguf_file(tmp_path):
  path = tmp_path / "junk.gguf"
  path.write_bytes(b"this is not gguf")
  with pytest.raises(CheckpointError, match="not a readable GGUF file"):
    loading.load_model(str(path), tokenizer=False)


def test_unknown_spec():
  with pytest.raises(CheckpointError, match="unknown model 'no-such-model'"):
    loading.load_model("no-such-model")
  with pytest.raises(CheckpointError, match="unknown preset"):
    loading.load_model("random:huge")
