"""Command-line habits of every entry point, mostly at the process level: fast `train --help`
without JAX, early first line, one-line errors that leave no empty directories, one flag spelling
with the dashed one accepted, help on every flag, and quiet broken pipes."""

import argparse
import io
import os
import subprocess
import sys
import time

import pytest

from spade_jax import bench_sampler, bench_train, cli, generate, train
from spade_jax import config as config_lib
from spade_jax.eval import run as eval_run
from spade_jax.sandbox import __main__ as sandbox_main
from spade_jax.sandbox import starters

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARSERS = {"train": train.parser, "generate": generate.parser,
           "bench sampler": bench_sampler.parser, "bench train": bench_train.parser,
           "eval.run": eval_run.parser, "sandbox": sandbox_main.parser}


def _env():
  env = dict(os.environ)
  env.pop("PYTHONUNBUFFERED", None)  # the first-line test must see the CLI's own flushing
  return env


def _run(*args, cwd=REPO, stdout=subprocess.PIPE, timeout=300):
  return subprocess.run([sys.executable, *args], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                        text=True, timeout=timeout, env=_env())


def _one_error_line(r):
  assert r.returncode != 0, r.stderr
  assert "Traceback" not in r.stderr, r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
  return lines[0]


# train --help, --print_config and the first line


@pytest.mark.parametrize("module", ["spade_jax.train", "spade_jax.sandbox"])
def test_help_works_anywhere_and_imports_no_jax(module, tmp_path):
  r = _run("-X", "importtime", "-m", module, "--help", cwd=tmp_path)
  assert r.returncode == 0, r.stderr
  imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()
              if line.startswith("import time:")}
  assert imported and not {m for m in imported if m == "jax" or m.startswith("jax.")}


def test_train_help_lists_presets_and_the_config_syntax(tmp_path):
  t0 = time.perf_counter()
  r = _run("-m", "spade_jax.train", "--help", cwd=tmp_path)
  assert r.returncode == 0 and time.perf_counter() - t0 < 20, r.stderr
  presets = config_lib.load_module(config_lib.shipped("spade.py")).PRESETS
  assert set(presets) == {"local", "qwen3_4b", "qwen3_8b", "qwen3_30b_a3b"}
  for name, what in presets.items():
    assert f"  {name}" in r.stdout and what in r.stdout
  words = " ".join(r.stdout.split())  # help wraps lines to the terminal width
  for text in ("--config FILE[:PRESET]", "--config.KEY VALUE", "looked up among the shipped "
               "configs", "--workdir DIR", "--print_config print the resolved config"):
    assert text in words


def test_every_preset_builds_and_an_unknown_one_lists_them():
  presets = config_lib.load_module(config_lib.shipped("spade.py")).PRESETS
  for name in presets:
    assert config_lib.load(f"configs/spade.py:{name}").preset == name
  with pytest.raises(ValueError, match="presets: local, qwen3_4b, qwen3_8b"):
    config_lib.load("configs/spade.py:qwen3_0b")


def test_print_config_resolves_validates_and_loads_nothing(tmp_path):
  r = _run("-m", "spade_jax.train", "--print-config", "--config.total-steps=7",
           "--config=configs/spade.py:qwen3_8b", "--config.model=/data/Qwen3-8B",
           "--config.corpus.builtin=true", cwd=tmp_path)
  assert r.returncode == 0, r.stderr
  assert "total_steps: 7" in r.stdout and "kl_beta: 0.005" in r.stdout
  assert "model: /data/Qwen3-8B" in r.stdout and os.listdir(tmp_path) == []
  r = _run("-m", "spade_jax.train", "--print_config", "--config.total_steps=0", cwd=tmp_path)
  assert "total_steps must be positive" in r.stderr and r.returncode != 0


def test_train_says_what_it_does_before_loading_the_model(tmp_path):
  t0 = time.perf_counter()
  p = subprocess.Popen([sys.executable, "-m", "spade_jax.train", "--config=configs/spade.py:local",
                        f"--workdir={tmp_path / 'run'}"], cwd=REPO, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
  try:
    first = p.stderr.readline()
    elapsed = time.perf_counter() - t0
    still_running = p.poll() is None
  finally:
    os.killpg(p.pid, 9)
    p.wait()
  assert first.startswith("spade_jax.train: model smollm2-135m"), first
  assert still_running and elapsed < 30, elapsed


# train: one clean line, no empty workdir


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
  """A .gguf cut in half, a safetensors directory with a truncated file, names of nothing."""
  from spade_jax import gguf_io, hf, loading

  d = tmp_path_factory.mktemp("models")
  src = gguf_io.embedded_gguf_path("smollm2-135m")
  with open(src, "rb") as f, open(d / "half.gguf", "wb") as g:
    g.write(f.read(os.path.getsize(src) // 2))
  m = loading.load_model("random:tiny", tokenizer=False)
  hf.export(str(d / "hf"), m.cfg, m.params)
  st = d / "hf" / "model.safetensors"
  os.truncate(st, os.path.getsize(st) // 2)
  return {"missing": ("/nonexistent", "unknown model '/nonexistent'"),
          "missing_gguf": (str(d / "none.gguf"), "none.gguf: no such file"),
          "half_gguf": (str(d / "half.gguf"), "half.gguf: not a readable GGUF file"),
          "truncated_safetensors": (str(d / "hf"), "model.safetensors: truncated")}


@pytest.mark.parametrize("kind", ["missing", "missing_gguf", "half_gguf", "truncated_safetensors"])
def test_train_bad_model_is_one_line_and_creates_no_workdir(bad_models, kind, tmp_path):
  spec, message = bad_models[kind]
  r = _run("-m", "spade_jax.train", f"--config.model={spec}",
           f"--workdir={tmp_path / 'runs' / 'a'}")
  assert message in _one_error_line(r)
  assert not os.path.exists(tmp_path / "runs")


def test_train_workdir_that_is_a_file_is_one_line(tmp_path):
  (tmp_path / "f").write_text("keep")
  for workdir, message in ((tmp_path / "f", "exists and is not a directory"),
                           (tmp_path / "f" / "run", "is not a directory")):
    r = _run("-m", "spade_jax.train", f"--workdir={workdir}")
    assert message in _one_error_line(r)
  assert (tmp_path / "f").read_text() == "keep"


def test_a_failed_start_removes_only_the_empty_directories_it_created(tmp_path, monkeypatch):
  from spade_jax.convert import CheckpointError
  from spade_jax.selfplay import loop

  def failing_run(c, workdir):
    os.makedirs(workdir)
    raise CheckpointError("model.safetensors: truncated")

  monkeypatch.setattr(loop, "run", failing_run)
  (tmp_path / "kept").mkdir()
  workdir = tmp_path / "kept" / "new" / "run"
  with pytest.raises(SystemExit, match="error: model.safetensors: truncated"):
    train.main([f"--workdir={workdir}"])
  assert os.listdir(tmp_path / "kept") == []
  workdir.mkdir(parents=True)  # a workdir that was there before the run is left alone
  with pytest.raises(SystemExit):
    train.main([f"--workdir={workdir}"])
  assert workdir.is_dir()


def test_remove_if_empty_keeps_directories_with_files(tmp_path):
  workdir = tmp_path / "a" / "b"
  top = train.check_workdir(str(workdir))
  assert top == str(tmp_path / "a")
  workdir.mkdir(parents=True)
  (workdir / "metrics.jsonl").write_text("{}")
  train.remove_if_empty(str(workdir), top)
  assert (workdir / "metrics.jsonl").exists()


# eval.run


def test_eval_out_that_is_a_file_is_one_line(tmp_path, capsys):
  (tmp_path / "f").write_text("keep")
  assert eval_run.main(["--model", "oracle", "--out", str(tmp_path / "f")]) == 2
  err = capsys.readouterr().err
  assert err == f"error: --out {str(tmp_path / 'f')!r} exists and is not a directory\n"
  assert eval_run.main(["--rescore", str(tmp_path), "--out", str(tmp_path / "f")]) == 2


def test_eval_bad_model_leaves_no_out_dir(tmp_path, capsys):
  out = tmp_path / "new" / "out"
  argv = ["--model", "/nonexistent", "--benchmarks", "aime24", "--out", str(out)]
  assert eval_run.main(argv) == 2
  assert "unknown model '/nonexistent'" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "new")


# sandbox validate


def test_validate_the_starters_glob_skips_init_and_passes():
  files = sorted(os.path.join("sandbox", "starters", f) for f in os.listdir(starters.DIR)
                 if f.endswith(".py"))
  assert any(f.endswith("__init__.py") for f in files)
  r = _run("-m", "spade_jax.sandbox", "validate", *files)
  assert r.returncode == 0, r.stdout + r.stderr
  lines = r.stdout.splitlines()
  assert lines[0].endswith("__init__.py: SKIPPED a package's __init__.py, not an environment")
  assert len(lines) == len(files) and all(line.endswith(": ADMITTED") for line in lines[1:])


def test_validate_an_unreadable_file_is_an_error(tmp_path):
  (tmp_path / "latin1.py").write_bytes(b"# caf\xe9\n" + starters.code("knapsack.py").encode())
  (tmp_path / "dir.py").mkdir()
  paths = [str(tmp_path / n) for n in ("latin1.py", "dir.py", "missing.py")]
  if os.geteuid() != 0:  # root reads a file whatever its mode
    (tmp_path / "locked.py").write_text(starters.code("knapsack.py"))
    os.chmod(tmp_path / "locked.py", 0)
    paths.append(str(tmp_path / "locked.py"))
  r = _run("-m", "spade_jax.sandbox", "validate", starters.path("knapsack.py"), *paths)
  assert r.returncode == 1
  lines = r.stdout.splitlines()
  assert lines[0].endswith("knapsack.py: ADMITTED")
  assert lines[1].endswith("latin1.py: ERROR cannot read: not UTF-8 (byte 0xe9 at offset 5)")
  assert lines[2].endswith("dir.py: ERROR cannot read: Is a directory")
  assert lines[3].endswith("missing.py: ERROR cannot read: No such file or directory")
  assert all("[OK]" not in line for line in lines)
  if len(paths) == 4:
    assert lines[4].endswith("locked.py: ERROR cannot read: Permission denied")


# one flag spelling


def test_underscored_rewrites_option_names_only():
  assert cli.underscored(["--data-dir=a-b", "--max-new-tokens", "--x-y", "v-w", "-h",
                          "--config.reward.lp-fast=0.5", "--", "--keep-me"]) == [
      "--data_dir=a-b", "--max_new_tokens", "--x_y", "v-w", "-h",
      "--config.reward.lp_fast=0.5", "--", "--keep-me"]


def _parsers():
  """(name, parser, positional placeholders) for every CLI and sandbox subcommand."""
  for name, make in PARSERS.items():
    p = make()
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
      yield name, p
    for sub in subs:
      for cmd, sp in sub.choices.items():
        yield f"{name} {cmd}", sp


def _value(action):
  if action.nargs == 0:
    return []
  if action.choices:
    return [list(action.choices)[-1]]
  return ["3"] if action.type in (int, float) else ["x"]


def test_every_long_option_is_accepted_in_both_spellings():
  checked = 0
  for name, p in _parsers():
    positionals = ["f.py" for a in p._actions if not a.option_strings]
    for action in p._actions:
      for opt in action.option_strings:
        if not opt.startswith("--") or "_" not in opt or opt.startswith("--config"):
          continue
        args = [opt, *_value(action)]
        dashed = [opt.replace("_", "-"), *_value(action)]
        assert (p.parse_args(cli.underscored(positionals + dashed))
                == p.parse_args(cli.underscored(positionals + args))), (name, opt)
        checked += 1
  assert checked >= 20


@pytest.mark.parametrize("argv, message", [
    (["spade_jax.generate", "--prompt", "x", "--top-p", "2"], "top_p must be in (0, 1]"),
    (["spade_jax.bench", "sampler", "--prompt-len", "many"], "argument --prompt_len: invalid int"),
    (["spade_jax.bench", "train", "--micro-batch", "many"], "argument --micro_batch: invalid int"),
    (["spade_jax.eval.run", "--max-new-tokens", "many"], "argument --max_new_tokens: invalid int"),
    (["spade_jax.sandbox", "validate", "f.py", "--memory-mb", "many"],
     "argument --memory_mb: invalid int"),
])
def test_each_cli_takes_the_dashed_spelling(argv, message):
  r = _run("-m", *argv)
  assert r.returncode != 0 and message in r.stderr, r.stderr


def test_every_flag_has_help_text():
  for name, p in _parsers():
    for action in p._actions:
      if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        assert action.help, (name, action.option_strings or action.dest)


# quiet broken pipes


def _closed_pipe():
  r, w = os.pipe()
  os.close(r)
  return w


@pytest.mark.parametrize("argv", [
    ["spade_jax.sandbox", "validate", "sandbox/starters/knapsack.py"],
    ["spade_jax.train", "--print_config"],
    ["spade_jax.bench", "--help"],
    ["spade_jax.eval.run", "--model", "oracle", "--benchmarks", "aime24", "--out", "{tmp}"],
])
def test_a_reader_that_went_away_ends_the_cli_quietly(argv, tmp_path):
  w = _closed_pipe()
  try:
    r = _run("-m", *[a.format(tmp=tmp_path / "out") for a in argv], stdout=w)
  finally:
    os.close(w)
  assert r.returncode == 141 and "Error" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_generate_output_into_a_closed_pipe_is_quiet(monkeypatch):
  monkeypatch.setattr(generate, "run", lambda c: ["a completion"])
  w = _closed_pipe()
  monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(os.fdopen(w, "wb"), write_through=True))
  with pytest.raises(SystemExit) as e:
    generate.main(["--prompt", "x"])
  assert e.value.code == 141


def test_a_broken_pipe_that_is_not_stdout_still_raises():
  def worker_gone():
    raise BrokenPipeError("a sandbox worker's pipe")

  with pytest.raises(BrokenPipeError):
    cli.quiet_broken_pipe(worker_gone)
