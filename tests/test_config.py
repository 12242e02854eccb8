"""ml-collections configs: loading, typed overrides, locked keys, validation."""

import pytest

from spade_jax import config as config_lib
from spade_jax import generate


def test_overrides_are_typed_and_nested():
  c, rest = config_lib.from_argv(
      ["--config=configs/generate.py", "--config.top_k=5", "--config.mesh.tensor", "2",
       "--config.chat=true", "--config.rules.embed=('fsdp', 'data')", "--other", "x"],
      "configs/generate.py")
  assert c.top_k == 5 and c.mesh.tensor == 2 and c.chat is True
  assert c.rules.embed == ("fsdp", "data")
  assert rest == ["--other", "x"]


@pytest.mark.parametrize("arg, err, match", [
    ("--config.top_kk=3", KeyError, "unknown key"),
    ("--config.top_k=0.5", ValueError, "expected an integer"),
    ("--config.chat=maybe", ValueError, "expected true/false"),
    ("--config.nosection.x=1", KeyError, "not a config section"),
])
def test_bad_overrides_fail_at_start(arg, err, match):
  with pytest.raises(err, match=match):
    config_lib.from_argv([arg], "configs/generate.py")


def test_missing_config_file():
  with pytest.raises(FileNotFoundError, match="does not exist"):
    config_lib.load("configs/nope.py")


def test_cli_flags_set_config_fields_and_are_validated():
  c = generate.parse(["--model", "random:tiny", "--prompt", "hi", "--greedy", "--top_p", "0.5"])
  assert (c.model, c.prompt, c.greedy, c.top_p) == ("random:tiny", "hi", True, 0.5)
  generate.validate(c)
  c.top_p = 1.5
  with pytest.raises(ValueError, match="top_p must be in"):
    generate.validate(c)
  with pytest.raises(ValueError, match="prompt is empty"):
    generate.validate(generate.parse([]))
