"""spade_jax: SPADE self-play (one model as environment designer and reasoning agent) in JAX.

The repository keeps `sandbox/`, `eval/` and `configs/` as top-level folders beside this package;
installed (pyproject.toml), they become `spade_jax.sandbox`, `spade_jax.eval` and
`spade_jax.configs`, so site-packages gains one name rather than generic ones that could shadow
other packages. In a checkout that is not installed, the same names resolve to those folders.
This module imports nothing heavy: the sandbox imports it and must stay free of JAX.
"""

import os as _os

_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (not _os.path.isdir(_os.path.join(__path__[0], "sandbox"))
    and _os.path.isfile(_os.path.join(_checkout, "sandbox", "contract.py"))):
  __path__.append(_checkout)
