"""What reaches the host outside the reply checks: episodes must die with the host process even
when they clear their parent-death signal, and the human-readable command-line output must not
pass an environment's terminal control bytes (ESC, CR, OSC 52) or invalid text to the terminal."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spade_jax.sandbox import starters
from spade_jax.sandbox.contract import Status
from spade_jax.sandbox.pool import Pool

from .sandbox_helpers import alive, descendants, env, episode_pids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(starters.DIR)))

HOST = textwrap.dedent('''
    import json, sys, time
    from spade_jax.sandbox.pool import Pool
    code = sys.stdin.read()
    with Pool(workers=1) as p:
        (r,) = list(p.start_many({0: code}))
        p.submit_steps({r.episode: "x"}, timeout=300)  # the step never returns
        print(json.dumps([r.status.value, r.reason, p._root, p.protections["tmpfs"]]), flush=True)
        time.sleep(120)
''')


def test_episodes_die_with_the_host_even_without_pdeathsig():
    reset = """
    import ctypes
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0: "do not kill me with my parent"
    """
    host = subprocess.Popen([sys.executable, "-c", HOST], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        host.stdin.write(env("import time\ntime.sleep(3600)", reset_body=reset))
        host.stdin.close()
        status, reason, root, tmpfs = json.loads(host.stdout.readline())
        assert status == "OK", reason
        time.sleep(0.5)  # the episode is inside its step
        below = descendants(host.pid)
        assert len(below) >= 2, below  # a worker and its episode at least
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
        deadline = time.monotonic() + 5
        while any(alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = [p for p in below if alive(p)]
    finally:
        if host.poll() is None:
            host.kill()
    for p in survivors:  # do not leave them running whatever the outcome
        os.kill(p, signal.SIGKILL)
    assert survivors == [], f"processes outlived the host: {survivors}"
    if tmpfs:  # the workers keep their files in their own namespaces: nothing on the host's disk
        assert not os.path.exists(root), os.listdir(root)


def test_episodes_die_with_a_killed_worker_even_without_pdeathsig():
    """The same without the race between the worker's death signal and its socket's EOF: the
    worker itself is SIGKILLed (as the OOM killer would)."""
    reset = "import ctypes\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\n"
    with Pool(workers=1) as pool:
        if not pool.protections.get("pidns", True):
            pytest.skip(f"no pid namespace here: a killed worker leaves such children (probe: {pool.protections})")
        (r,) = list(pool.start_many({0: env("import time\ntime.sleep(3600)", reset_body=reset)}))
        assert r.ok, r.reason
        pool.submit_steps({r.episode: "x"}, timeout=60)
        time.sleep(0.3)
        (victim,) = episode_pids(pool)
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        (dead,) = pool.wait([r.episode])
        assert dead.status is Status.CRASHED
        deadline = time.monotonic() + 5
        while alive(victim) and time.monotonic() < deadline:
            time.sleep(0.05)
        survived = alive(victim)
        if survived:
            os.kill(victim, signal.SIGKILL)
        assert not survived, "the episode outlived its worker"
        assert pool.play(env("result = 'x'"), 0, ["a"])[-1].ok  # a new worker serves


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "spade_jax.sandbox", *args], cwd=REPO, capture_output=True,
                          timeout=timeout)


NASTY = "\x1b]52;c;aGVsbG8=\x07\x1b[2J\rover\x9b31m\u202e"


def _nasty_env() -> str:
    return textwrap.dedent(f'''
        class NastyEnv:
            def reset(self, seed=None):
                self.t = 0
                return "start \\\\boxed{{x}} " + {NASTY!r}, {{}}
            def step(self, action):
                self.t += 1
                if self.t == 2:
                    raise ValueError({NASTY!r})
                return {NASTY!r}, 0.0, False, False, {{}}
    ''')


def _clean(out: bytes) -> None:
    text = out.decode("utf-8")
    for ch in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert ch not in text, (ch, text)


def test_play_escapes_control_bytes(tmp_path):
    path = tmp_path / "nasty.py"
    path.write_text(_nasty_env())
    out = _cli("play", str(path), "--seed", "1", "--actions", "a", "b", "--timeout", "2")
    assert b"Traceback" not in out.stderr, out.stderr
    _clean(out.stdout)
    assert b"\\x1b" in out.stdout and b"ENV_ERROR" in out.stdout
    js = _cli("play", str(path), "--seed", "1", "--actions", "a", "--json", "--timeout", "2")
    rows = [json.loads(line) for line in js.stdout.splitlines()]
    assert rows[1]["observation"] == NASTY  # --json keeps the exact text; JSON escapes it


def test_play_survives_a_lone_surrogate(tmp_path):
    path = tmp_path / "surrogate.py"
    path.write_text(env("return '\\ud800', 0.0, False, False, {}"))
    out = _cli("play", str(path), "--seed", "1", "--actions", "a", "--timeout", "2")
    assert b"Traceback" not in out.stderr, out.stderr
    assert b"INVALID_RETURN" in out.stdout
    out.stdout.decode("utf-8")


def test_validate_escapes_control_bytes(tmp_path):
    path = tmp_path / "nasty.py"
    path.write_text(_nasty_env().replace("if self.t == 2:", "if self.t == 1:"))
    out = _cli("validate", str(path), "--timeout", "2")
    assert out.returncode == 1 and b"REJECTED" in out.stdout, out
    _clean(out.stdout)
