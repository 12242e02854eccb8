"""Command line: check environments by hand, and measure the sandbox.

  python -m spade_jax.sandbox validate FILE... [--json] [--seed N]
  python -m spade_jax.sandbox play FILE --seed S --actions A1 A2 ... [--solution] [--json]
  python -m spade_jax.sandbox bench
  python -m spade_jax.sandbox probe

`validate` judges all files in one pool, concurrently; each file gets its own line, whatever the
others do. A file that cannot be read (missing, a directory, not UTF-8) is an error line; a
package's `__init__.py` (as in `validate sandbox/starters/*.py`) is skipped, never judged.
Exit status: 0 when every judged file was admitted (validate) or the episode ran (play).
Flags are spelled with underscores (`--memory_mb`); the dashed spelling is accepted too.
Human-readable lines show an environment's control characters as escapes (`\x1b`), so that an
environment cannot drive the terminal; `--json` carries the exact text, JSON-escaped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from spade_jax import cli  # standard library only: the sandbox stays free of JAX

from . import bench
from .contract import Limits, extract_code
from .pool import DEFAULT_REQUIRE, Pool
from .text import for_terminal
from .validate import Options, validate_many


def _pool(args) -> Pool:
    limits = dataclasses.replace(Limits(), memory_bytes=args.memory_mb << 20)
    if args.timeout is not None:
        limits = dataclasses.replace(limits, load_s=args.timeout, reset_s=args.timeout, step_s=args.timeout)
    require = [r for r in args.require.split(",") if r]
    return Pool(workers=args.workers, limits=limits, require=require)


def _read(path: str) -> tuple[str | None, str]:
    """(text, "") or (None, why not): decoding is strict, as a replaced byte would change the code."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(), ""
    except OSError as e:
        return None, f"cannot read: {e.strerror}"
    except UnicodeDecodeError as e:
        return None, f"cannot read: not UTF-8 (byte {e.object[e.start]:#04x} at offset {e.start})"


def _row(path: str, text: str | None, err: str) -> dict | None:
    """The row of a file that is not judged (skipped or unreadable); None for one to judge."""
    if os.path.basename(path) == "__init__.py":
        return {"file": path, "skipped": True, "reason": "a package's __init__.py, not an environment"}
    if text is None:
        return {"file": path, "admitted": False, "check": "code", "status": "UNREADABLE", "reason": err}
    return None


def _line(row: dict) -> str:
    if row.get("skipped"):
        mark = "SKIPPED"
    elif row["status"] == "UNREADABLE":
        mark = "ERROR"
    else:
        mark = "ADMITTED" if row["admitted"] else f"REJECTED {row['check']} [{row['status']}]"
    return for_terminal(f"{row['file']}: {mark} {row['reason']}".rstrip(), one_line=True)


def cmd_validate(args) -> int:
    rows, judged = [], {}
    for path in args.files:
        text, err = _read(path)
        rows.append(_row(path, text, err))
        if rows[-1] is None:
            judged[len(rows) - 1] = text
    if judged:
        with _pool(args) as pool:
            options = Options(total_s=args.total_s, seed=args.seed)
            verdicts = validate_many(pool, list(judged.values()), options)
        for i, v in zip(judged, verdicts):
            rows[i] = {"file": args.files[i], **v.to_json()}
    for row in rows:
        print(json.dumps(row) if args.json else _line(row), flush=True)
    return 0 if all(row.get("skipped") or row["admitted"] for row in rows) else 1


def cmd_play(args) -> int:
    text, err = _read(args.file)
    if text is None:
        print(for_terminal(f"{args.file}: {err}", one_line=True), file=sys.stderr)
        return 2
    with _pool(args) as pool:
        if args.solution:
            from .pool import Start

            (first,) = list(pool.start_many({0: Start(extract_code(text), args.seed, solution=True)}))
            pool.end_many([first.episode])
            actions = list(first.solution or [])
        else:
            actions = list(args.actions)
        replies = pool.play(extract_code(text), args.seed, actions)
    for i, r in enumerate(replies):
        row = {"turn": i, "action": actions[i - 1] if i else None, **r.transcript_entry()}
        if r.reason:
            row["reason"] = r.reason
        if args.json:
            print(json.dumps(row))
        else:
            head = "reset" if i == 0 else f"step {i} {row['action']!r}"
            flags = f"reward={r.reward:g} terminated={r.terminated} truncated={r.truncated}"
            print(for_terminal(f"--- {head}: {r.status.value} {flags if i else ''} {r.reason}".rstrip(),
                               one_line=True))
            print(for_terminal(r.observation))
    return 0 if all(r.ok for r in replies) else 1


def cmd_bench(args) -> int:
    print(json.dumps(bench.run(episodes=args.episodes, spawn_episodes=args.spawn_episodes,
                               in_flight=args.in_flight, workers=args.workers)))
    return 0


def cmd_probe(args) -> int:
    with _pool(args) as pool:
        print(json.dumps(pool.protections))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spade_jax.sandbox", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, workers=2):
        sp.add_argument("--workers", type=int, default=workers, help="zygote processes (default: %(default)s)")
        sp.add_argument("--memory_mb", type=int, default=1024, help="address-space limit per episode")
        sp.add_argument("--timeout", type=float, default=None,
                        help="deadline in seconds for each load, reset and step (default: Limits)")
        sp.add_argument("--require", default=",".join(DEFAULT_REQUIRE),
                        help="comma-separated protections that must be in force (empty: none)")

    v = sub.add_parser("validate", help="admission checks, one line per file")
    v.add_argument("files", nargs="+", metavar="FILE",
                   help="environment programs (code, or a reply with a fenced python block)")
    v.add_argument("--json", action="store_true", help="one JSON object per file instead of a line")
    v.add_argument("--total_s", type=float, default=60.0, help="deadline per environment")
    v.add_argument("--seed", type=int, default=None,
                   help="seed of the validator's draws (reset seeds, probe actions); default: fresh")
    common(v)
    v.set_defaults(fn=cmd_validate)

    pl = sub.add_parser("play", help="run one episode and print its transcript")
    pl.add_argument("file", help="the environment program")
    pl.add_argument("--seed", type=int, default=None, help="the seed reset() gets")
    pl.add_argument("--actions", nargs="*", default=[], help="the agent's actions, one per step")
    pl.add_argument("--solution", action="store_true", help="play the environment's own solution()")
    pl.add_argument("--json", action="store_true", help="one JSON object per turn")
    common(pl, workers=1)
    pl.set_defaults(fn=cmd_play)

    b = sub.add_parser("bench", help="pool vs fresh-process throughput, step round trip")
    b.add_argument("--episodes", type=int, default=200, help="episodes through the pool")
    b.add_argument("--spawn_episodes", type=int, default=40, help="episodes run as fresh processes")
    b.add_argument("--in_flight", type=int, default=8, help="episodes live at once")
    b.add_argument("--workers", type=int, default=None, help="zygote processes (default: min(4, CPUs))")
    b.set_defaults(fn=cmd_bench)

    pr = sub.add_parser("probe", help="print which protections are in force")
    common(pr, workers=1)
    pr.set_defaults(fn=cmd_probe)

    return p


def _main(argv) -> int:
    args = parser().parse_args(cli.underscored(argv))
    return args.fn(args)


def main(argv=None) -> int:
    return cli.quiet_broken_pipe(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
