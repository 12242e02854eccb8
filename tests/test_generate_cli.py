"""The generate CLI end to end, as a user runs it."""

import subprocess
import sys


def _run(*args):
  return subprocess.run([sys.executable, "-m", "spade_jax.generate", *args], capture_output=True,
                        text=True, timeout=300)


def test_chat_generation_with_embedded_model():
  r = _run("--model", "smollm2-135m", "--chat", "--prompt", "What is 2 + 2?", "--greedy",
           "--max_new_tokens", "6")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip()


def test_bad_input_is_a_clear_error():
  r = _run("--model", "smollm2-135m", "--prompt", "x", "--top_p", "2")
  assert r.returncode != 0 and "top_p must be in (0, 1]" in r.stderr
  r = _run("--model", "/no/such/dir", "--prompt", "x")
  assert r.returncode != 0 and "unknown model '/no/such/dir'" in r.stderr
