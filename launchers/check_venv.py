"""Checks that a virtual environment holds what the requirements files pin: used by venv.sh.

`python launchers/check_venv.py FILE...` exits 0 when every `name==version` pin of the files is
installed at that version with all of its recorded files present, the core modules import, and
`spade_jax` resolves to this checkout; otherwise it prints each problem and exits 1. A stamp
file alone cannot tell a damaged environment (a package deleted or half-removed, a different
version installed by hand) from a good one. Standard library only: it runs before anything is
installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import importlib.metadata as md
import os
import re
import sys

CORE_MODULES = ("numpy", "jax", "ml_collections", "tokenizers", "transformers", "gguf")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)")


def pins(paths: list[str]) -> dict[str, str]:
  out = {}
  for path in paths:
    with open(path) as f:
      for line in f:
        m = _PIN.match(line)
        if m:
          out[m.group(1)] = m.group(2)
  return out


def _missing_files(dist: md.Distribution) -> list[str]:
  missing = []
  for f in dist.files or ():
    if f.suffix == ".pyc" or "__pycache__" in f.parts:
      continue  # compiled caches come and go
    path = f.locate()
    if not os.path.exists(path):
      missing.append(str(f))
  return missing


def problems(paths: list[str], checkout: str) -> list[str]:
  found = []
  for name, version in pins(paths).items():
    try:
      dist = md.distribution(name)
    except md.PackageNotFoundError:
      found.append(f"{name}=={version} is not installed")
      continue
    installed = dist.version if "+" in version else dist.version.split("+")[0]
    if installed != version:  # `==2.13.0` admits the local build 2.13.0+cpu, as pip does
      found.append(f"{name} is {dist.version}, requirements pin {version}")
      continue
    missing = _missing_files(dist)
    if missing:
      found.append(f"{name}: {len(missing)} installed files are missing (e.g. {missing[0]})")
  if found:
    return found  # imports would only repeat these
  for module in CORE_MODULES:
    try:
      importlib.import_module(module)
    except Exception as e:  # any failure to import means the environment is unusable
      found.append(f"import {module} fails: {type(e).__name__}: {e}")
  spec = importlib.util.find_spec("spade_jax")
  expected = os.path.join(checkout, "spade_jax")
  where = list(spec.submodule_search_locations or ()) if spec else []
  if not any(os.path.realpath(p) == os.path.realpath(expected) for p in where):
    found.append(f"spade_jax is not installed from this checkout ({where or 'not found'})")
  return found


def main(argv: list[str]) -> int:
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found"
  checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  found = problems(argv, checkout)
  for p in found:
    print(f"venv: {p}", file=sys.stderr)
  return 1 if found else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
