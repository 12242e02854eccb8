"""Qwen3-MoE against transformers (greedy decoding, load-balancing loss, config.json fields), the
grouped matmuls against the dense reference (forward and backward), expert parallelism on 8 fake
devices against one device, and sharded HF export. Logit parity and the plain export round trip
of the tiny MoE configs run with the dense ones in test_model_parity (hf_models.MOE_CONFIGS)."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

torch = pytest.importorskip("torch")

from spade_jax import hf, loading, moe, sampling, sharding  # noqa: E402
from spade_jax import model as model_lib  # noqa: E402
from spade_jax.convert import CheckpointError  # noqa: E402
from tests import hf_models  # noqa: E402

CFG = model_lib.PRESETS["tiny_moe"]


@pytest.fixture(scope="module", params=sorted(hf_models.MOE_CONFIGS))
def saved(request, tmp_path_factory):
  m = hf_models.build(request.param)
  d = tmp_path_factory.mktemp(request.param)
  m.save_pretrained(d, safe_serialization=True)
  return request.param, m, str(d)


def test_config_json_is_read_as_transformers_reads_it(saved):
  name, m, d = saved
  cfg = loading.load_model(d, tokenizer=False).cfg
  c = m.config
  assert (cfg.n_experts, cfg.experts_per_token, cfg.d_ff_expert, cfg.norm_topk_prob) == (
      c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob)
  sparse = [i for i, layer in enumerate(m.model.layers) if hasattr(layer.mlp, "experts")]
  assert list(cfg.sparse_layers) == sparse and 0 < len(sparse) < cfg.n_layers, name
  with open(os.path.join(d, "config.json")) as f:
    raw = json.load(f)
  for key in ("norm_topk_prob", "num_local_experts", "num_experts", "mlp_only_layers"):
    raw.pop(key, None)
  # Absent fields take Qwen3MoeConfig's defaults: norm_topk_prob False, 128 experts.
  bare = hf.config_from_hf(dict(raw, num_experts_per_tok=2))
  assert bare.norm_topk_prob is False and bare.n_experts == 128 and bare.mlp_only_layers == ()
  with pytest.raises(CheckpointError, match="shared experts"):
    hf.config_from_hf(dict(raw, shared_expert_intermediate_size=16))
  # Checkpoint metadata goes through JSON, where a tuple comes back as a list.
  again = model_lib.ModelConfig(**json.loads(json.dumps(dataclasses.asdict(cfg))))
  assert again == cfg and hash(again) == hash(cfg)


def test_greedy_decoding_matches_transformers(saved):
  """20 greedy tokens from three prompts, batched and left-padded on both sides."""
  name, m, d = saved
  loaded = loading.load_model(d, tokenizer=False)
  prompts = [[5, 17, 3, 90, 41], [2, 8], [66, 12, 1, 9, 9, 30, 4]]
  sampler = sampling.Sampler(loaded.cfg, sharding.make_mesh({"data": 1}, jax.devices()[:1]))
  out = sampler.generate(loaded.params, prompts,
                         dataclasses.replace(sampling.GREEDY, max_new_tokens=20), seed=0)
  T = max(map(len, prompts))
  ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
  mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
  with torch.inference_mode():
    ref = m.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                     pad_token_id=0, eos_token_id=None)[:, T:]
  np.testing.assert_array_equal(out.tokens, ref.numpy(), err_msg=name)


def test_load_balancing_loss_matches_transformers(saved):
  name, m, d = saved
  loaded = loading.load_model(d, tokenizer=False)
  tokens = np.random.default_rng(1).integers(0, 97, (2, 9))
  with torch.no_grad():
    ref = float(m(torch.as_tensor(tokens), output_router_logits=True).aux_loss)
  _, stats = jax.jit(lambda p, t: model_lib.hidden_states(p, t, loaded.cfg,
                                                         routing=moe.Routing()))(
      loaded.params, tokens)
  np.testing.assert_allclose(float(moe.aux_loss(stats)), ref, rtol=1e-5, err_msg=name)


def _routing_problem(seed=0, N=37, D=24, E=6, k=2, F=20):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.normal(size=(N, D)), jnp.float32)
  w = [jnp.asarray(0.3 * rng.normal(size=s), jnp.float32) for s in ((E, D, F), (E, D, F),
                                                                  (E, F, D))]
  r = moe.route(h, jnp.asarray(rng.normal(size=(D, E)), jnp.float32), k, True)
  experts = np.array(r.experts)
  experts[:5, 0] = E + 1  # assignments another shard owns, and one with none at all
  experts[5] = -1
  return h, jnp.asarray(experts), r.weights, w


@pytest.mark.parametrize("impl", ["tiles", "ragged_dot", "megablox"])
def test_grouped_matmuls_equal_the_dense_reference_forward_and_backward(impl):
  """Values and all gradients; assignments outside the shard's experts add nothing. Megablox
  runs in the Pallas interpreter off TPU."""
  h, experts, weights, w = _routing_problem()
  g_out = jnp.asarray(np.random.default_rng(2).normal(size=h.shape), jnp.float32)

  def loss(impl):
    return lambda h, wt, *w: jnp.sum(moe.ffn(h, experts, wt, *w, impl, "float32") * g_out)

  ours, ref = loss(impl), loss("dense")
  np.testing.assert_allclose(ours(h, weights, *w), ref(h, weights, *w), rtol=1e-5)
  grads = jax.grad(ours, argnums=(0, 1, 2, 3, 4))(h, weights, *w)
  for a, b in zip(grads, jax.grad(ref, argnums=(0, 1, 2, 3, 4))(h, weights, *w)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_replayed_routing_keeps_experts_and_recomputes_their_weights():
  rng = np.random.default_rng(3)
  h, router = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((4, 8), (8, 5)))
  fresh = moe.route(h, router, 2, norm_topk=False)
  assert np.all(np.asarray(fresh.weights)[:, 0] >= np.asarray(fresh.weights)[:, 1])
  np.testing.assert_allclose(fresh.probs.sum(-1), 1.0, rtol=1e-6)
  replay = np.array([[4, 0], [-1, -1], [1, 2], [3, 4]], np.int32)
  r = moe.route(h, router, 2, norm_topk=True, replay_Nk=jnp.asarray(replay))
  np.testing.assert_array_equal(r.experts[1], fresh.experts[1])  # -1: routed afresh
  np.testing.assert_array_equal(np.asarray(r.experts)[[0, 2, 3]], replay[[0, 2, 3]])
  picked = np.take_along_axis(np.asarray(fresh.probs), np.asarray(r.experts), -1)
  np.testing.assert_allclose(r.weights, picked / picked.sum(-1, keepdims=True), rtol=1e-6)


def test_expert_parallel_forward_equals_one_device():
  """Experts over the expert axis, the model dim over fsdp, expert width over tensor, the tokens
  already on every expert shard (the default rules: the expert axis does not split the batch;
  test_moe_engines runs the preset's rules, where it does and tokens are gathered)."""
  rules = sharding.DEFAULT_RULES
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "expert": 2, "tensor": 2})
  params = sharding.init_sharded(CFG, jax.random.key(4), mesh, rules)
  w = params["moe"]["w_gate"]
  assert w.sharding.spec == P(None, "expert", "fsdp", "tensor")
  assert w.addressable_shards[0].data.shape == (2, CFG.n_experts // 2, CFG.d_model // 2,
                                                CFG.d_ff_expert // 2)
  single = jax.tree.map(lambda a: jax.device_put(a, jax.devices()[0]), params)
  tokens = np.random.default_rng(5).integers(0, CFG.vocab_size, (4, 10)).astype(np.int32)
  batch = jax.device_put(tokens, sharding.batch_sharding(mesh, rules))
  dispatch = moe.make_dispatch(mesh, rules)
  out = jax.jit(lambda p, t: model_lib.forward(p, t, CFG, dispatch=dispatch))(params, batch)
  ref = jax.jit(lambda p, t: model_lib.forward(p, t, CFG))(single, jnp.asarray(tokens))
  assert len(out.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


def test_sharded_export_writes_an_index_transformers_loads(tmp_path):
  import transformers

  cfg = CFG.replace(tie_embeddings=True)
  params = jax.jit(model_lib.init_params, static_argnums=0)(cfg, jax.random.key(6))
  hf.export(str(tmp_path), cfg, params, max_shard_bytes=60_000)
  with open(tmp_path / "model.safetensors.index.json") as f:
    files = set(json.load(f)["weight_map"].values())
  assert len(files) > 3 and not (tmp_path / "model.safetensors").exists()
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
  tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, (2, 8))
  ours = np.asarray(jax.jit(lambda p, t: model_lib.forward(p, t, cfg))(params, tokens))
  assert np.abs(hf_models.logits(back, tokens) - ours).max() < 1e-4
  again = loading.load_model(str(tmp_path), tokenizer=False)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_generate_cli_decodes_a_moe_checkpoint_greedily_as_transformers(tmp_path):
  """A random Qwen3-MoE directory with a tokenizer (SmolLM2's vocabulary), as a user points the
  CLI at one: the printed text is transformers' greedy continuation, up to its first stop."""
  import transformers

  from spade_jax import gguf_io
  from spade_jax import tokenizer as tok_lib

  tok = tok_lib.load_tokenizer(gguf_io.embedded_gguf_path("smollm2-135m"))
  cfg = transformers.Qwen3MoeConfig(**dict(hf_models.TINY_MOE, vocab_size=len(tok)),
                                    rope_theta=1e6, norm_topk_prob=True, mlp_only_layers=[0],
                                    tie_word_embeddings=False)
  m = hf_models.build(cfg, seed=5)
  m.save_pretrained(tmp_path, safe_serialization=True)
  tok.save_pretrained(tmp_path)
  prompt = "The capital of France is"
  r = subprocess.run([sys.executable, "-m", "spade_jax.generate", "--model", str(tmp_path),
                      "--greedy", "--prompt", prompt, "--max_new_tokens", "24"],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  stops = set(tok_lib.stop_token_ids(tok))
  ids = torch.tensor([tok(prompt)["input_ids"]])
  with torch.inference_mode():
    new = m.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=sorted(stops),
                     pad_token_id=0)[0, ids.shape[1]:].tolist()
  want = tok.decode([t for t in new if t not in stops])
  assert len(new) > 12 and r.stdout == want + "\n", (new, r.stdout, want)


def test_gguf_qwen3moe_matches_transformers(tmp_path):
  """A qwen3moe GGUF file laid out as llama.cpp's converter writes one (each layer's experts one
  [E, out, in] tensor), read by us and by transformers' GGUF loader: the same logits."""
  import gguf
  import transformers

  cfg = transformers.Qwen3MoeConfig(**dict(hf_models.TINY_MOE, moe_intermediate_size=768,
                                           num_experts=4, num_experts_per_tok=2),
                                    rope_theta=1e6, norm_topk_prob=True, tie_word_embeddings=False)
  m = hf_models.build(cfg, seed=2)
  sd = {k: v.numpy() for k, v in m.state_dict().items()}
  F = cfg.moe_intermediate_size
  w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "qwen3moe")
  for add, v in ((w.add_block_count, cfg.num_hidden_layers), (w.add_context_length, 128),
                 (w.add_embedding_length, cfg.hidden_size), (w.add_feed_forward_length, 80),
                 (w.add_head_count, cfg.num_attention_heads),
                 (w.add_head_count_kv, cfg.num_key_value_heads), (w.add_key_length, 12),
                 (w.add_value_length, 12), (w.add_rope_freq_base, 1e6),
                 (w.add_layer_norm_rms_eps, cfg.rms_norm_eps), (w.add_expert_count, 4),
                 (w.add_expert_used_count, 2), (w.add_expert_feed_forward_length, F),
                 (w.add_vocab_size, cfg.vocab_size)):
    add(v)
  names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
  per_layer = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight":
               "ffn_norm", "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight":
               "attn_k", "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight":
               "attn_output", "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight":
               "attn_k_norm", "mlp.gate.weight": "ffn_gate_inp", "mlp.experts.down_proj":
               "ffn_down_exps"}
  for i in range(cfg.num_hidden_layers):
    names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}.weight" for k, v in per_layer.items()})
    gate_up = sd.pop(f"model.layers.{i}.mlp.experts.gate_up_proj")  # [E, 2F, D]
    w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :F]))
    w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, F:]))
  for k, v in sd.items():
    w.add_tensor(names[k], np.ascontiguousarray(v))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  ours = loading.load_model(str(tmp_path / "m.gguf"), tokenizer=False)
  assert ours.cfg.sparse_layers == (0, 1, 2) and ours.cfg.norm_topk_prob
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf",
                                                           dtype=torch.float32).eval()
  tokens = np.random.default_rng(8).integers(0, cfg.vocab_size, (2, 9))
  got = np.asarray(jax.jit(lambda p, t: model_lib.forward(p, t, ours.cfg))(ours.params, tokens))
  assert np.abs(got - hf_models.logits(m, tokens)).max() < 1e-4
  assert np.abs(got - hf_models.logits(back, tokens)).max() < 1e-4
