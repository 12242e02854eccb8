"""Hostile environments against the sandbox: each case must end in the right typed outcome,
leave the host untouched and no process behind, and the pool must keep serving afterwards."""

import dataclasses
import os
import socket
import textwrap
import time

import pytest

from spade_jax.sandbox.contract import Limits, Status
from spade_jax.sandbox.pool import Pool

LIMITS = dataclasses.replace(Limits(), memory_bytes=256 << 20, load_s=3.0, reset_s=1.0, step_s=0.6,
                             cpu_seconds=10, max_observation_chars=4096)
SECRET = "sandbox-secret-7d1f"

GOOD = textwrap.dedent('''
    class CountEnv:
        def reset(self, seed=None):
            self.n = 0
            return "Say anything three times, in \\\\boxed{...}.", {}
        def step(self, action):
            self.n += 1
            return f"n={self.n}", float(self.n >= 3), self.n >= 3, False, {"n": self.n}
''')


def env(step_body: str, reset_body: str = "", prelude: str = "") -> str:
    """An environment whose step (and optionally reset) runs the given code. `result` is what
    step reports back as its observation when the code returns normally."""
    return (textwrap.dedent(prelude) + "\nclass HostileEnv:\n    def reset(self, seed=None):\n"
            + textwrap.indent(textwrap.dedent(reset_body) or "pass", " " * 8)
            + "\n        return 'hostile: actions go in \\\\boxed{...}', {}\n"
            + "    def step(self, action):\n        result = ''\n"
            + textwrap.indent(textwrap.dedent(step_body), " " * 8)
            + "\n        return str(result), 0.0, False, False, {}\n")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def no_leftovers(pool: Pool, timeout: float = 3.0) -> None:
    """Every episode is over, so no worker may have a child (alive or zombie) any more."""
    assert pool.live == 0
    deadline = time.monotonic() + timeout
    while True:
        kids = [c for w in pool.worker_pids() for c in _children(w)]
        if not kids or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert kids == [], f"left-over processes {kids}"


def still_serves(pool: Pool) -> None:
    replies = pool.play(GOOD, 0, ["\\boxed{a}"] * 3)
    assert [r.status for r in replies] == [Status.OK] * 4
    assert replies[-1].terminated and replies[-1].reward == 1.0


@pytest.fixture(scope="module")
def pool():
    os.environ["SANDBOX_TEST_SECRET"] = SECRET  # the host has a secret the workers must not see
    with Pool(workers=2, limits=LIMITS) as p:
        yield p
    os.environ.pop("SANDBOX_TEST_SECRET", None)


@pytest.fixture
def checked(pool):
    pids = pool.worker_pids()
    yield pool
    no_leftovers(pool)
    still_serves(pool)
    assert pool.worker_pids() == pids, "a worker died"
    no_leftovers(pool)


def step_once(pool, code, action="\\boxed{1}", timeout=None):
    replies = pool.play(code, 0, [action], timeout=timeout)
    assert replies[0].ok, replies[0].reason
    return replies[-1]


# --------------------------------------------------------------------------- runaway code


def test_infinite_loop_is_killed(checked):
    t = time.monotonic()
    r = step_once(checked, env("while True:\n    pass"))
    assert r.status is Status.TIMEOUT
    assert time.monotonic() - t < LIMITS.step_s + 2


def test_loop_that_ignores_and_catches_signals_is_killed(checked):
    body = """
    import signal
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP, signal.SIGXCPU):
        signal.signal(s, signal.SIG_IGN)
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
    """
    assert step_once(checked, env(body)).status is Status.TIMEOUT


def test_loop_at_load_time_is_killed(checked):
    (r,) = list(checked.start_many({0: "while True:\n    pass\n"}))
    assert r.status is Status.TIMEOUT


def test_memory_bomb(checked):
    # Filling the address space takes a while on a slow machine: a longer deadline than usual.
    r = step_once(checked, env("hoard = []\nwhile True:\n    hoard.append(bytearray(1 << 24))"), timeout=10)
    assert r.status is Status.OOM
    r = step_once(checked, env("result = len(bytearray(1 << 40))"))
    assert r.status is Status.OOM


# --------------------------------------------------------------------------- processes


def test_fork_bomb_and_subprocesses_are_refused(checked):
    body = """
    import os, subprocess, threading
    made, errors = 0, []
    for attempt in (lambda: os.fork(), lambda: subprocess.run(["/bin/true"]),
                    lambda: os.system("true"), lambda: os.posix_spawn("/bin/true", ["true"], {}),
                    lambda: os.execv("/bin/true", ["true"])):
        for _ in range(50):
            try:
                pid = attempt()
                if pid == 0:
                    os._exit(0)
                made += 1
            except OSError as e:
                errors.append(type(e).__name__)
    t = threading.Thread(target=lambda: None)  # threads are still fine
    t.start(); t.join()
    result = f"made={made} errors={len(errors)}"
    """
    r = step_once(checked, env(body))
    assert r.ok, r.reason
    # os.system reports failure by its return code, not an exception; nothing may run either way
    assert r.observation.startswith("made=50 ") or r.observation.startswith("made=0 "), r.observation
    assert "errors=" in r.observation and int(r.observation.split("errors=")[1]) >= 200


def test_uncaught_fork_is_an_env_error(checked):
    r = step_once(checked, env("import os\nwhile True:\n    os.fork()"))
    assert r.status is Status.ENV_ERROR and "PermissionError" in r.reason


def test_killing_parent_worker_host_or_everyone_fails(checked):
    body = f"""
    import os, signal
    refused = []
    for target in (os.getppid(), {os.getpid()}, 1, -1, 0):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError as e:
            refused.append(type(e).__name__)
    try:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    except OSError as e:
        refused.append(type(e).__name__)
    result = ",".join(refused)
    """
    r = step_once(checked, env(body))
    assert r.ok, r.reason
    assert r.observation.split(",") == ["PermissionError"] * 6


def test_exit_and_segfault(checked):
    assert step_once(checked, env("import os\nos._exit(3)")).status is Status.CRASHED
    r = step_once(checked, env("import sys\nsys.exit(0)"))
    assert r.status is Status.ENV_ERROR and "SystemExit" in r.reason
    r = step_once(checked, env("import faulthandler\nfaulthandler._sigsegv()"))
    assert r.status is Status.CRASHED and "SIGSEGV" in r.reason
    r = step_once(checked, env("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)"))
    assert r.status is Status.CRASHED


def test_leftover_threads_die_with_the_episode(checked):
    reset = """
    import threading, time
    def spin():
        while True:
            pass
    for target in (spin, lambda: time.sleep(3600)):
        threading.Thread(target=target, daemon=False).start()
    """
    replies = checked.play(env("result = 'still answering'", reset_body=reset), 0, ["\\boxed{1}"] * 3)
    assert [r.status for r in replies] == [Status.OK] * 4
    assert replies[-1].observation == "still answering"


# --------------------------------------------------------------------------- the host's data


def test_writing_outside_the_temp_dir_fails(checked, tmp_path):
    if not checked.protections["landlock"]:
        pytest.skip(f"Landlock not available here (probe: {checked.protections})")
    target = tmp_path / "escape"
    tmp_path.chmod(0o777)  # even a world-writable directory is out of reach
    body = f"""
    import os
    wrote = []
    for path in ({str(target)!r}, "/tmp/sandbox-escape-{os.getpid()}", "/dev/shm/sandbox-escape"):
        try:
            with open(path, "w") as f:
                f.write("x")
            wrote.append(path)
        except OSError:
            pass
    with open("inside.txt", "w") as f:  # the episode's own temp dir is writable
        f.write("ok")
    result = "wrote:" + ",".join(wrote)
    """
    r = step_once(checked, env(body))
    assert r.ok, r.reason
    assert r.observation == "wrote:"
    assert not target.exists() and not os.path.exists(f"/tmp/sandbox-escape-{os.getpid()}")


def test_root_owned_files_are_out_of_reach(checked, tmp_path):
    if not checked.protections["unprivileged"]:
        pytest.skip("children are not unprivileged here")
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    body = f"""
    try:
        with open({str(victim)!r}, "w") as f:
            f.write("changed")
        result = "wrote"
    except OSError as e:
        result = type(e).__name__
    """
    r = step_once(checked, env(body))
    # Refused, or not even there: with its own root, the worker's view has no host files at all.
    assert r.ok and r.observation in ("PermissionError", "FileNotFoundError"), r
    assert victim.read_text() == "original"


def test_no_network_even_to_loopback(checked):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    body = f"""
    import socket
    outcomes = []
    for attempt in (lambda: socket.create_connection(("127.0.0.1", {port}), timeout=0.5),
                    lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {port})),
                    lambda: socket.socket(socket.AF_UNIX).connect("/run/anything.sock"),
                    lambda: socket.socketpair()):
        try:
            attempt()
            outcomes.append("connected")
        except Exception as e:
            outcomes.append(type(e).__name__)
    result = ",".join(outcomes)
    """
    try:
        r = step_once(checked, env(body))
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert r.ok, r.reason
    assert "connected" not in r.observation


def test_host_environment_is_invisible(checked):
    body = """
    import os
    seen = [repr(dict(os.environ))]
    for pid in ["self", str(os.getppid()), "1"] + [p for p in os.listdir("/proc") if p.isdigit()][:200]:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                seen.append(f.read().decode(errors="replace"))
        except OSError:
            pass
    result = "\\n".join(seen)[:3000]
    """
    # Listing /proc itself may be refused (Landlock); that is an env error, and also fine.
    r = step_once(checked, env(body))
    assert SECRET not in r.observation and SECRET not in r.reason
    body = f"""
    try:
        with open("/proc/{os.getpid()}/environ", "rb") as f:
            result = f.read().decode(errors="replace")
    except OSError as e:
        result = type(e).__name__
    """
    r = step_once(checked, env(body))
    assert r.ok and SECRET not in r.observation


# --------------------------------------------------------------------------- replies


def test_huge_outputs(checked):
    assert step_once(checked, env("result = 'x' * (50 << 20)")).status is Status.OUTPUT_TOO_LARGE
    assert step_once(checked, env("result = 'x' * 10000")).status is Status.OUTPUT_TOO_LARGE
    code = GOOD.replace('{"n": self.n}', '{"blob": "y" * 200000}')
    assert step_once(checked, code).status is Status.OUTPUT_TOO_LARGE
    r = step_once(checked, env("print('z' * (8 << 20))\nresult = 'quiet'"))  # stdout goes nowhere
    assert r.ok and r.observation == "quiet"


def test_forged_frames_on_the_reply_pipe(checked):
    r = step_once(checked, env("import os\nos.write(4, b'\\xff\\xff\\xff\\xff')\nwhile True:\n    pass"))
    assert r.status is Status.OUTPUT_TOO_LARGE
    r = step_once(checked, env("import os\nos.write(4, b'\\x00\\x00\\x00\\x03}}}')\nwhile True:\n    pass"))
    assert r.status is Status.PROTOCOL_ERROR


@pytest.mark.parametrize("reward", ["float('nan')", "float('inf')", "'1.0'", "True", "None", "11.0",
                                    "[1.0]", "10**400"])
def test_bad_rewards(checked, reward):
    code = GOOD.replace("float(self.n >= 3)", reward)
    r = step_once(checked, code)
    assert r.status is Status.INVALID_RETURN, (reward, r)


@pytest.mark.parametrize("ret", ["(obs, 0.0, False, {})", "(obs, 0.0, False, False, {}, None)", "obs",
                                 "[obs, 0.0, 'no', False, {}]", "(obs, 0.0, False, False, [])",
                                 "(1, 0.0, False, False, {})"])
def test_wrong_step_returns(checked, ret):
    code = env("obs = 'o'\nreturn " + ret)
    assert step_once(checked, code).status is Status.INVALID_RETURN


def test_wrong_reset_returns(checked):
    for ret in ("'just a string'", "('', {})", "('obs', None)", "('obs', {}, 1)"):
        code = GOOD.replace('return "Say anything three times, in \\\\boxed{...}.", {}', "return " + ret)
        (r,) = list(checked.start_many({0: code}))
        assert r.status is Status.INVALID_RETURN, (ret, r)


def test_malicious_reduce_in_info_is_never_run(checked, tmp_path):
    marker = tmp_path / "pwned"
    prelude = f"""
    import os
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch {marker}",))
    """
    code = env("return 'o', 0.0, False, False, {'evil': Evil()}", prelude=prelude)
    r = step_once(checked, code)
    assert r.status is Status.INVALID_RETURN and "JSON" in r.reason
    assert not marker.exists()


def test_syntax_and_contract_errors_at_load(checked):
    cases = {"def broken(:\n": "compile", "x = 1\n": "class",
             "class AEnv:\n  pass\nclass BEnv:\n  pass\n": "class",
             "class AEnv:\n  def __init__(self, a, b):\n    pass\n": "init"}
    for code, phase in cases.items():
        (r,) = list(checked.start_many({0: code}))
        assert r.status is Status.ENV_ERROR and r.phase == phase, (code, r)
