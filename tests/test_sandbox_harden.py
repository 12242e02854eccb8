"""Hardening pieces on their own: a missing libseccomp is reported, not a crash."""

import os
import subprocess
import sys

import pytest

from spade_jax.sandbox import seccomp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(seccomp.__file__)))


def test_missing_libseccomp_is_reported_not_fatal():
    # Without pyseccomp (or libseccomp.so.2 behind it) the module still imports and says why.
    code = ("import sys; sys.modules['pyseccomp'] = None\n"
            "from sandbox import seccomp\n"
            "print(repr(seccomp.SECCOMP_IMPORT_ERROR))\n"
            "try:\n    seccomp.program()\nexcept OSError as e:\n    print('refused', e.errno)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert "pyseccomp" in first and second == "refused 38"  # ENOSYS


def test_compiled_filter_has_the_pid_slot():
    if seccomp._seccomp is None:
        pytest.skip(f"pyseccomp unavailable here: {seccomp.SECCOMP_IMPORT_ERROR}")
    prog = seccomp.program()
    assert len(prog) % 8 == 0 and seccomp.ks(prog).count(seccomp.PID_SENTINEL) >= 1
