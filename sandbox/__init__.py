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

Layout: protocol.py (JSON frames), text.py (what text may cross), contract.py (limits, typed
outcomes, reply checks), outcomes.py (replies and exits to outcomes), seccomp.py, namespaces.py,
harden.py (the child's hardening), cgroups.py, cleanup.py, episode.py (the child's side),
worker.py (the zygote), zygotes.py (host-side worker handles), probe.py, pool.py (the batched
API), probes.py, admission.py and validate.py (admission), execute.py, bench.py and
__main__.py (command line), starters/ (hand-written environments by skill).
"""
