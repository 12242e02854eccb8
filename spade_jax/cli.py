"""Habits shared by the command-line entry points: one flag spelling, and a quiet broken pipe.

Flags are spelled with underscores (`--prompt_len`, `--config.reward.variant`), as the configs'
keys are; `underscored` rewrites the dashed spelling (`--prompt-len`) before argparse sees it, so
both work and help lists one. `quiet_broken_pipe` runs an entry point so that a reader of stdout
that goes away (`... | head -1`) ends the process quietly, as it ends a Unix tool.
Standard library only: `train --help` and the sandbox import this module, and neither may pay
for (or, in the sandbox's case, ever import) JAX.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import Callable, Sequence, TypeVar

R = TypeVar("R")

ALIAS_NOTE = ("Flags are spelled with underscores; the dashed spelling is accepted too\n"
              "(--max-new-tokens for --max_new_tokens).")


def underscored(argv: Sequence[str]) -> list[str]:
  """argv with the dashes in every long option's name made underscores (`--data-dir=x` ->
  `--data_dir=x`). Values and everything after a bare `--` are kept as given."""
  out = list(argv)
  for i, a in enumerate(out):
    if a == "--":
      break
    if a.startswith("--"):
      name, eq, value = a.partition("=")
      out[i] = "--" + name[2:].replace("-", "_") + eq + value
  return out


def _stdout_is_broken() -> bool:
  """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
  try:
    fd = sys.stdout.fileno()
  except (AttributeError, ValueError, OSError):  # replaced by a stream without a descriptor
    return False
  poller = select.poll()
  poller.register(fd, select.POLLOUT)
  return any(events & select.POLLERR for _, events in poller.poll(0))


def quiet_broken_pipe(fn: Callable[..., R], *args) -> R:
  """fn(*args); if stdout's reader went away, exits with 128 + SIGPIPE (what a tool killed by
  SIGPIPE returns) and no traceback. A broken pipe to anything else (a sandbox worker) still
  raises: SIGPIPE stays ignored, since the sandbox pool relies on EPIPE from dead children."""
  try:
    result = fn(*args)
    sys.stdout.flush()  # lines still buffered must meet the broken pipe here, not at exit
    return result
  except BrokenPipeError:
    if not _stdout_is_broken():
      raise
    # The interpreter flushes stdout again at exit; pointing it at /dev/null keeps that quiet.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)
