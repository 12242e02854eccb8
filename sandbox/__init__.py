"""Host-side execution and verification of generated environments. Never imports JAX.

What the self-play loop uses:

    from spade_jax.sandbox.contract import Limits, Status
    from spade_jax.sandbox.pool import DEFAULT_REQUIRE, Pool, Start
    from spade_jax.sandbox.validate import validate_many, rejection_stats, Options
    from spade_jax.sandbox import starters

    with Pool(workers=4, limits=Limits(...), require=DEFAULT_REQUIRE) as pool:
        verdicts = validate_many(pool, designer_outputs)          # admission, all at once
        for r in pool.start_many({key: Start(code, seed)}): ...    # r.key, r.episode, r.observation
        for r in pool.step_many({episode: action}): ...            # replies in finishing order
        pool.submit_steps(...); pool.wait(episodes)                # the same, split in two
        pool.end_many(episodes)                                    # abandon

Layout: protocol.py (JSON frames), contract.py (limits, typed outcomes, reply checks),
harden.py (rlimits, seccomp, Landlock, namespaces), worker.py (the zygote process and its
episode children), zygotes.py (host-side worker handles), pool.py (the batched API),
validate.py (admission), bench.py and __main__.py (command line), starters/ (hand-written
environments by skill).
"""
