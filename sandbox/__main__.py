"""Command line: check environments by hand, and measure the sandbox.

  python -m spade_jax.sandbox validate FILE... [--json]
  python -m spade_jax.sandbox play FILE --seed S --actions A1 A2 ... [--solution] [--json]
  python -m spade_jax.sandbox bench
  python -m spade_jax.sandbox probe

`validate` judges all files in one pool, concurrently; each file gets its own line, whatever the
others do. Exit status: 0 when everything was admitted (validate) or the episode ran (play).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from . import bench
from .contract import Limits, extract_code
from .pool import DEFAULT_REQUIRE, Pool
from .validate import Options, validate_many


def _pool(args) -> Pool:
    limits = dataclasses.replace(Limits(), memory_bytes=args.memory_mb << 20)
    if args.timeout is not None:
        limits = dataclasses.replace(limits, load_s=args.timeout, reset_s=args.timeout, step_s=args.timeout)
    require = [r for r in args.require.split(",") if r]
    return Pool(workers=args.workers, limits=limits, require=require)


def _read(path: str) -> tuple[str | None, str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), ""
    except OSError as e:
        return None, f"cannot read: {e.strerror}"


def cmd_validate(args) -> int:
    texts, unreadable = [], {}
    for i, path in enumerate(args.files):
        text, err = _read(path)
        texts.append(text or "")
        if text is None:
            unreadable[i] = err
    with _pool(args) as pool:
        verdicts = validate_many(pool, texts, Options(total_s=args.total_s))
    ok = True
    for i, (path, v) in enumerate(zip(args.files, verdicts)):
        row = {"file": path, **v.to_json()}
        if i in unreadable:
            row.update(admitted=False, check="code", status="OK", reason=unreadable[i])
        ok &= row["admitted"]
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            mark = "ADMITTED" if row["admitted"] else f"REJECTED {row['check']} [{row['status']}]"
            print(f"{path}: {mark} {row['reason']}".rstrip(), flush=True)
    return 0 if ok else 1


def cmd_play(args) -> int:
    text, err = _read(args.file)
    if text is None:
        print(f"{args.file}: {err}", file=sys.stderr)
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
            print(f"--- {head}: {r.status.value} {flags if i else ''} {r.reason}".rstrip())
            print(r.observation)
    return 0 if all(r.ok for r in replies) else 1


def cmd_bench(args) -> int:
    print(json.dumps(bench.run(episodes=args.episodes, spawn_episodes=args.spawn_episodes,
                               in_flight=args.in_flight, workers=args.workers)))
    return 0


def cmd_probe(args) -> int:
    with _pool(args) as pool:
        print(json.dumps(pool.protections))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m spade_jax.sandbox", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, workers=2):
        sp.add_argument("--workers", type=int, default=workers)
        sp.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per episode")
        sp.add_argument("--timeout", type=float, default=None,
                        help="deadline in seconds for each load, reset and step (default: Limits)")
        sp.add_argument("--require", default=",".join(DEFAULT_REQUIRE),
                        help="comma-separated protections that must be in force (empty: none)")

    v = sub.add_parser("validate", help="admission checks, one line per file")
    v.add_argument("files", nargs="+")
    v.add_argument("--json", action="store_true")
    v.add_argument("--total-s", type=float, default=60.0, help="deadline per environment")
    common(v)
    v.set_defaults(fn=cmd_validate)

    pl = sub.add_parser("play", help="run one episode and print its transcript")
    pl.add_argument("file")
    pl.add_argument("--seed", type=int, default=None)
    pl.add_argument("--actions", nargs="*", default=[])
    pl.add_argument("--solution", action="store_true", help="play the environment's own solution()")
    pl.add_argument("--json", action="store_true")
    common(pl, workers=1)
    pl.set_defaults(fn=cmd_play)

    b = sub.add_parser("bench", help="pool vs fresh-process throughput, step round trip")
    b.add_argument("--episodes", type=int, default=200)
    b.add_argument("--spawn-episodes", type=int, default=40)
    b.add_argument("--in-flight", type=int, default=8)
    b.add_argument("--workers", type=int, default=None)
    b.set_defaults(fn=cmd_bench)

    pr = sub.add_parser("probe", help="print which protections are in force")
    common(pr, workers=1)
    pr.set_defaults(fn=cmd_probe)

    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
