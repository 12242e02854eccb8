"""Held-out benchmarks (docs/method.md §10): one generation interface, offline data, saved samples.

`python -m spade_jax.eval.run --model SPEC --benchmarks LIST --preset smoke|paper --out DIR` samples every
benchmark, writes one JSONL line per graded sample as it completes and a summary table at the
end; `--rescore DIR` grades the saved samples again without a model.
"""
