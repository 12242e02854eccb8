"""BFCL-v4 multi-turn (base, miss_func, miss_param, long_context) from the `bfcl-eval` package.

Data, prompts and verdicts are BFCL's own: the entries and ground truths in `bfcl_eval/data`,
the default prompting-mode system prompt (python call lists, JSON function docs, the Python
syntax hint), the held-out-function message of miss_func, tool results as "tool" turns, the
20-step limit per user turn (a run over it is force-terminated and fails), and the official
`multi_turn_checker` (state and response checks after every turn) on the decoded step
responses. Our model drives the loop: each step is one call of the generation interface.

One deliberate difference, for safety: BFCL turns model output into Python source and eval()s it
in this process. Here a step is decoded by `decode_calls`, which accepts only what BFCL's decoder
accepts *and* is a call of a public method of the entry's API classes with literal keyword
arguments; everything else (attribute calls, unknown names, computed arguments) is treated as a
failed decode, or, for an unknown function inside a valid list, as a call that errors. The
strings handed to BFCL's executor are re-rendered from the parsed literals, so no model text is
ever evaluated. Positional arguments are dropped, as BFCL's decoder drops them.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import importlib.resources
import inspect
import json
import uuid

from .generation import Prompt, Sampling
from .protocol import Benchmark, Unavailable

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
_BLOCKED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # as BFCL


class DecodeError(ValueError):
  pass


def _bfcl(module: str):
  try:
    return importlib.import_module(f"bfcl_eval.{module}")
  except ModuleNotFoundError as e:
    raise Unavailable(f"the bfcl-eval package is not installed, or lacks a dependency ({e})") \
        from None


def _data(path: str) -> list[dict]:
  ref = importlib.resources.files("bfcl_eval").joinpath("data", path)
  return [json.loads(line) for line in ref.read_text(encoding="utf-8").splitlines() if line.strip()]


@functools.lru_cache(maxsize=None)
def api_methods(class_name: str) -> dict[str, list[str]]:
  """Public methods of one BFCL API class -> their parameter names (in order)."""
  cfg = _bfcl("constants.executable_backend_config")
  cls = getattr(importlib.import_module(cfg.CLASS_FILE_PATH_MAPPING[class_name]), class_name)
  out = {}
  for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction):
    if not name.startswith("_"):
      out[name] = [p for p in inspect.signature(fn).parameters if p != "self"]
  return out


def system_prompt(functions: list[dict]) -> str:
  """BFCL's default prompting system prompt (DEFAULT_SYSTEM_PROMPT_FORMAT)."""
  p = _bfcl("constants.default_prompts")
  style = p.PROMPT_STYLE_TEMPLATES["classic"]
  return p.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
      persona=style["persona"], task=style["task"],
      tool_call_format=style["tool_call_no_tag"].format(
          output_format=p.OUTPUT_FORMAT_MAPPING["python"],
          param_types=p.PARAM_TYPE_MAPPING["python"]),
      multiturn_behavior=style["multiturn_behavior"],
      available_tools=style["available_tools"].format(
          format="json", functions=json.dumps(functions, indent=4)))


def _entry_functions(entry: dict) -> tuple[list[dict], dict[str, list[dict]]]:
  """Function docs shown at the start, and the held-out ones by turn (miss_func)."""
  cfg = _bfcl("constants.executable_backend_config")
  docs = []
  for cls in entry["involved_classes"]:
    docs += _data(f"multi_turn_func_doc/{cfg.MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]}")
  missed = {}
  for turn, names in entry.get("missed_function", {}).items():
    missed[turn] = [d for d in docs if d["name"] in names]
    docs = [d for d in docs if d["name"] not in names]
  for d in docs:  # BFCL's language hint goes on the initially listed functions only
    d["description"] += " Note that the provided function is in Python 3 syntax."
  return docs, missed


def load_category(category: str) -> list[dict]:
  entries = _data(f"BFCL_v4_multi_turn_{category}.json")
  truth = {r["id"]: r["ground_truth"] for r in _data(
      f"possible_answer/BFCL_v4_multi_turn_{category}.json")}
  items = []
  for entry in sorted(entries, key=lambda e: int(e["id"].rsplit("_", 1)[1])):
    docs, missed = _entry_functions(entry)
    first = [{"role": "system", "content": system_prompt(docs)}] + list(entry["question"][0])
    items.append({"id": entry["id"], "entry": entry, "missed": missed,
                  "gold": truth[entry["id"]], "category": category,
                  "prompt": Prompt(tuple(first))})
  return items


# ----------------------------------------------------------------------------- decoding


def _value(node):
  """A literal argument, decoded as BFCL's resolve_ast_by_type does, minus anything computed."""
  if isinstance(node, ast.Constant):
    return "..." if node.value is Ellipsis else node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
      and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float)):
    return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
  if isinstance(node, ast.List):
    return [_value(v) for v in node.elts]
  if isinstance(node, ast.Tuple):
    return tuple(_value(v) for v in node.elts)
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise DecodeError("dict unpacking in an argument")
    return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
  if isinstance(node, ast.Name):
    return node.id  # BFCL reads a bare name as its string
  if isinstance(node, ast.Call) and not node.keywords:
    return ast.unparse(node)  # as BFCL: a call without keywords becomes its source text
  raise DecodeError(f"unsupported argument {ast.unparse(node)[:60]!r}")


def decode_calls(text: str) -> list[tuple[str, dict]]:
  """BFCL's default_decode_execute_prompting, parsed instead of evaluated: [(name, kwargs)]."""
  s = text.strip("`\n ")
  if not s.startswith("["):
    s = "[" + s
  if not s.endswith("]"):
    s = s + "]"
  try:
    body = ast.parse(s.strip().strip("'"), mode="eval").body
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise DecodeError(f"not a python call list: {e}") from None
  calls = [body] if isinstance(body, ast.Call) else getattr(body, "elts", None)
  if calls is None or not all(isinstance(c, ast.Call) for c in calls):
    raise DecodeError("not a list of calls")
  out = []
  for c in calls:
    parts, f = [], c.func
    while isinstance(f, ast.Attribute):
      parts.append(f.attr)
      f = f.value
    if not isinstance(f, ast.Name):
      raise DecodeError("call of a computed function")
    parts.append(f.id)
    if any(k.arg is None for k in c.keywords):
      raise DecodeError("**kwargs in a call")
    out.append((".".join(reversed(parts)), {k.arg: _value(k.value) for k in c.keywords}))
  return out


def render(name: str, kwargs: dict) -> str:
  return f"{name}({','.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def _allowed(entry: dict) -> set[str]:
  return {m for cls in entry["involved_classes"] for m in api_methods(cls)} - set(_BLOCKED)


def decode_step(text: str, entry: dict) -> list[str]:
  """Executable call strings of one step; raises DecodeError like BFCL's decoder would."""
  allowed = _allowed(entry)
  return [render(n, kw) if n in allowed else f"__unknown__:{n}" for n, kw in decode_calls(text)]


# ----------------------------------------------------------------------------- execution


def _execute(calls: list[str], entry: dict, model_name: str, is_eval: bool) -> list[str]:
  utils = _bfcl("eval_checker.multi_turn_eval.multi_turn_utils")
  known = [c for c in calls if not c.startswith("__unknown__:")]
  results, _ = utils.execute_multi_turn_func_call(
      known, entry.get("initial_config", {}), entry["involved_classes"], model_name, entry["id"],
      long_context="long_context" in entry["id"], is_evaL_run=is_eval)
  it = iter(results)
  return [f"Error during execution: name '{c.split(':', 1)[1]}' is not defined"
          if c.startswith("__unknown__:") else next(it) for c in calls]


def _forget(model_name: str) -> None:
  """BFCL caches API instances in a module global, keyed by model name: drop this episode's."""
  utils = _bfcl("eval_checker.multi_turn_eval.multi_turn_utils")
  g = vars(utils)
  for k in [k for k in g if k.startswith(model_name)]:
    del g[k]


def _oracle_step(item: dict, turn: int, step: int) -> str:
  """Scripted correct behaviour: the turn's ground-truth calls, then an empty reply."""
  gt = item["gold"][turn]
  if step > 0:
    return ""
  if not gt:
    return "I cannot complete this request: a required function or parameter is missing."
  methods = {}
  for cls in item["entry"]["involved_classes"]:
    methods.update(api_methods(cls))
  calls = []
  for src in gt:
    call = ast.parse(src, mode="eval").body
    params = methods[call.func.id]
    kwargs = {params[i]: ast.literal_eval(a) for i, a in enumerate(call.args)}
    kwargs.update({k.arg: ast.literal_eval(k.value) for k in call.keywords})
    calls.append(render(call.func.id, kwargs))
  return "[" + ", ".join(calls) + "]"


class _Episode:
  def __init__(self, item: dict, sample: int):
    self.item, self.sample = item, sample
    self.model = f"spade_{uuid.uuid4().hex}"
    self.messages = list(item["prompt"].messages)
    self.turn, self.step, self.steps_total = 0, 0, 0
    self.responses: list[list[str]] = [[]]
    self.done = False

  def prompt(self) -> Prompt:
    return Prompt(tuple(self.messages), oracle=_oracle_step(self.item, self.turn, self.step))

  def next_turn(self, p) -> None:
    self.turn += 1
    self.step = 0
    questions = self.item["entry"]["question"]
    if self.turn >= len(questions):
      self.done = True
      return
    msgs = list(questions[self.turn])
    missed = self.item["missed"].get(str(self.turn))
    if missed is not None:
      msgs = [{"role": "user", "content":
               p.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=missed)}]
    self.messages += msgs
    self.responses.append([])


def play(items, gen, proto, ctx):
  """Runs every (item, sample) episode, all advancing together, one model call per step."""
  p = _bfcl("constants.default_prompts")
  limit = proto.max_steps
  episodes = [_Episode(it, s) for it in items for s in range(proto.sampling.n)]
  one = Sampling(**{**proto.sampling.__dict__, "n": 1})
  live = list(episodes)
  try:
    while live:
      texts = [c[0] for c in gen.generate([e.prompt() for e in live], one)]
      for ep, text in zip(live, texts):
        ep.messages.append({"role": "assistant", "content": text})
        ep.responses[-1].append(text)
        try:
          calls = decode_step(text, ep.item["entry"])
        except DecodeError:
          calls = []
        if not calls:
          ep.next_turn(p)
          continue
        for call, result in zip(calls, _execute(calls, ep.item["entry"], ep.model, False)):
          ep.messages.append({"role": "tool", "name": call, "content": result})
        ep.step += 1
        if ep.step > limit:  # BFCL force-quits the whole entry
          ep.done = True
      for ep in [e for e in live if e.done]:
        _forget(ep.model)
        yield ep.item, ep.sample, ep.responses
      live = [e for e in live if not e.done]
  finally:
    for ep in live:
      _forget(ep.model)


def grade_one(item: dict, responses) -> dict:
  checker = _bfcl("eval_checker.multi_turn_eval.multi_turn_checker")
  entry, gt = item["entry"], item["gold"]
  if not isinstance(responses, list) or not all(
      isinstance(t, list) and all(isinstance(s, str) for s in t) for t in responses):
    return {"extracted": None, "score": 0.0, "error": "responses are not a list of turns"}
  decoded = []
  for turn in responses:
    steps = []
    for text in turn:
      try:
        calls = [c for c in decode_step(text, entry) if not c.startswith("__unknown__:")]
      except DecodeError:
        continue
      if calls:
        steps.append(calls)
    decoded.append(steps)
  if len(responses) != len(gt):
    return {"extracted": decoded, "score": 0.0, "error": "multi_turn:force_terminated"}
  name = f"spade_{uuid.uuid4().hex}"
  try:
    res = checker.multi_turn_checker(decoded, gt, copy.deepcopy(entry),
                                     f"multi_turn_{item['category']}", name)
  finally:
    _forget(name)
  out = {"extracted": decoded, "score": float(bool(res["valid"]))}
  if not res["valid"]:
    out["error"] = res.get("error_type", "invalid")
  return out


def grade(pairs, ctx) -> list[dict]:
  return [grade_one(item, responses) for item, responses in pairs]


def _bench(category: str) -> Benchmark:
  return Benchmark(f"bfcl_mt_{category}", "tool_use", lambda ctx: load_category(category), grade,
                   play=play)


BENCHMARKS = [_bench(c) for c in CATEGORIES]
