"""Benchmark accounting: the bytes and FLOPs that the roofline and MFU figures divide by, and the
speed ratio against a peer."""

import sys

import jax
import numpy as np
import pytest

from spade_jax import bench_sampler
from spade_jax import bench_train
from spade_jax import model as model_lib


def test_decode_bytes_per_step_counts_read_weights_and_live_cache():
  cfg = model_lib.PRESETS["tiny"]  # untied: the 256 x 64 embedding table is gathered, not read
  params = model_lib.init_params(cfg, jax.random.key(0))
  # Weights other than the embedding: 90496 float32 values (hand-summed from the tiny preset).
  weights = 90496 * 4
  # 2 rows x mean live slots (8 prompt + (4 + 1) / 2) x 2 (k, v) x 2 layers x 2 heads x 16 x 4 B.
  cache = 2 * 10.5 * 512
  assert bench_sampler.decode_bytes_per_step(cfg, params, 2, 8, 4) == weights + cache


def test_decode_bytes_per_step_reads_a_tied_table_as_the_output_projection():
  cfg = model_lib.PRESETS["tiny"].replace(tie_embeddings=True)
  params = model_lib.init_params(cfg, jax.random.key(0))
  # No lm_head (64 x 256) but the embedding (256 x 64) is read in its place: same weight bytes.
  assert bench_sampler.decode_bytes_per_step(cfg, params, 1, 0, 1) == 90496 * 4 + 1 * 1 * 512


def test_train_flops_per_token_for_the_tiny_preset():
  cfg = model_lib.PRESETS["tiny"]
  # Matmul weights: 2 layers x (q 4096 + k 2048 + v 2048 + o 4096 + 3 x 8192 mlp) + head 16384.
  n = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192) + 16384
  attention = 12 * 2 * 32 * 4 * 16  # 12 x layers x T x heads x head_dim, T = 32
  assert bench_train.train_flops_per_token(cfg, 32) == 6 * n + attention


def test_compare_tunix_without_tunix_names_the_requirements_file(monkeypatch):
  from spade_jax import bench_tunix
  for name in ("tunix", "tunix.generate", "tunix.models", "tunix.models.llama3"):
    monkeypatch.setitem(sys.modules, name, None)  # makes `import` raise ImportError
  with pytest.raises(SystemExit, match="requirements-peer.txt"):
    bench_tunix._import_tunix()


def test_tunix_peer_generates_every_token_on_a_tiny_model():
  pytest.importorskip("tunix", reason="optional peer: pip install --no-deps -r "
                      "requirements-peer.txt")
  from spade_jax import bench_tunix
  from spade_jax import loading
  from spade_jax import sampling

  loaded = loading.load_model("random:tiny_smollm2", seed=0, tokenizer=False)
  peer = bench_tunix.TunixPeer(loaded, "float32")
  prompts = np.random.default_rng(0).integers(100, 1000, (2, 8))
  settings = sampling.Settings(max_new_tokens=6, temperature=0.6, top_k=20, top_p=0.95,
                               ignore_eos=True)
  assert peer.tokens_per_s(prompts, settings, 16, 1) > 0


def test_decode_bytes_per_step_counts_weights_in_the_compute_dtype():
  cfg = model_lib.PRESETS["tiny"].replace(dtype="bfloat16")
  params = model_lib.init_params(cfg.replace(dtype="float32"), jax.random.key(0))
  # Float32 master weights are read as the bfloat16 copies the sampler prepares: 2 bytes each.
  assert bench_sampler.decode_bytes_per_step(cfg, params, 1, 0, 1) == 90496 * 2 + 1 * 1 * 256


def test_accelerator_peak_reads_the_device_kind_and_is_none_on_cpu(monkeypatch):
  from spade_jax import bench

  assert bench.accelerator_peak(bench_sampler.PEAK_BYTES_PER_S) is None  # tests run on CPU
  h200 = type("Device", (), {"platform": "gpu", "device_kind": "NVIDIA H200"})()
  monkeypatch.setattr(jax, "devices", lambda: [h200])
  assert bench.accelerator_peak(bench_sampler.PEAK_BYTES_PER_S) == 4.8e12
  assert bench.accelerator_peak(bench_train.PEAK_FLOPS) == 989e12
  assert bench.accelerator_peak({"A100": 1.0}) is None


def test_paired_speedup_takes_the_median_of_per_pair_ratios():
  # Load that slows both sides of a pair alike cancels out in its ratio.
  ours, theirs = [1.0, 2.0, 4.0], [1.5, 2.2, 2.0]
  assert bench_train.paired_speedup(ours, theirs) == pytest.approx(1.1)
  with pytest.raises(ValueError, match="equal, non-empty"):
    bench_train.paired_speedup([1.0], [])
