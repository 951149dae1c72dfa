"""Batches and sweeps: one form (or one ``queue add``) expanded into the requests of one batch.

A batch is a list of prompts (or the one prompt), crossed with a grid over seed × steps ×
layout × deterministic, each repeated ``count`` times under a seed policy: ``fixed`` (every run
the base seed), ``increment`` (base, base+1, ...) or ``random`` (a seed drawn per run, recorded
as seed -1 is: the run's manifest says ``seed_asked: -1``). Everything is checked here and
planned by the caller before a single job is queued; the queue then adds the whole batch under
one lock, or none of it (:meth:`..jobqueue.JobQueue.add_batch`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..vocabulary.layouts import parse_layout
from ..vocabulary.paths import read_text
from ..vocabulary.request import RANDOM_SEED, draw_seed, whole_number

SEED_POLICIES = ("fixed", "increment", "random")
MAX_BATCH_RUNS = 256  # checked before expanding: a typo such as --count 100000 is refused at once
MAX_PROMPTS_BYTES = 1024 * 1024
_TRUE, _FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


@dataclass(frozen=True)
class BatchSpec:
    """What varies across a batch; an empty axis keeps the base request's value."""

    count: int = 1
    seed_policy: str = "fixed"
    prompts: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    layouts: tuple[str, ...] = ()
    deterministic: tuple[bool, ...] = ()

    def size(self) -> int:
        axes = (self.prompts, self.seeds, self.steps, self.layouts, self.deterministic)
        total = self.count
        for axis in axes:
            total *= max(1, len(axis))
        return total


@dataclass(frozen=True)
class BatchItem:
    """One run of a batch: the request's fields, its layout name, what sets it apart (``label``), and
    whether its seed was drawn (the run records ``seed_asked: -1`` then)."""

    fields: dict[str, Any]
    layout: str
    label: str
    seed_drawn: bool = False


def _items(text: Any, field: str, example: str) -> list[str]:
    if text is None:
        return []
    if not isinstance(text, str):
        raise InputError(field, "must be text", f"give values separated by commas, e.g. {example}")
    return [item.strip() for item in text.replace("\n", ",").split(",") if item.strip()]


def _whole(value: Any, field: str, example: str) -> int:
    number = whole_number(value, field)
    if not isinstance(number, int) or isinstance(number, bool):
        raise InputError(field, f"{str(value)[:40]!r} is not a whole number", f"give whole numbers, e.g. {example}")
    return number


def _unique(values: list, field: str, example: str) -> tuple:
    if len(set(values)) != len(values):
        raise InputError(field, "names a value twice", f"give each value once, e.g. {example}")
    return tuple(values)


def parse_spec(*, count: Any = 1, seed_policy: Any = "fixed", prompts: Any = None, seeds: Any = None,
               steps: Any = None, layouts: Any = None, deterministic: Any = None) -> BatchSpec:
    """The batch fields as typed (form text or CLI flags), checked: one InputError naming the field and the fix."""
    runs = 1 if count is None or count == "" else _whole(count, "count", "3")
    if runs < 1:
        raise InputError("count", f"{runs} is below 1", "give 1 or more runs")
    policy = (seed_policy or "fixed").strip().lower() if isinstance(seed_policy, str) else seed_policy
    if policy not in SEED_POLICIES:
        raise InputError("seed_policy", f"{str(policy)[:40]!r} is not a seed policy",
                         f"use one of {', '.join(SEED_POLICIES)}")
    prompt_list = prompt_lines(prompts) if isinstance(prompts, str) else list(prompts or ())
    seed_list = [_whole(item, "grid_seeds", "1,2,3") for item in _items(seeds, "grid_seeds", "1,2,3")]
    if any(seed < 0 for seed in seed_list):
        raise InputError("grid_seeds", "a seed is below 0", "give seeds of 0 or more (the grid names its seeds; "
                         "use the seed policy random for drawn ones)")
    step_list = [_whole(item, "grid_steps", "4,8,16") for item in _items(steps, "grid_steps", "4,8,16")]
    if any(value < 1 for value in step_list):
        raise InputError("grid_steps", "a step count is below 1", "give step counts of 1 or more, e.g. 4,8,16")
    layout_list = []
    for item in _items(layouts, "grid_layouts", "sp1-cfg1,sp2-cfg1"):
        try:
            layout_list.append(parse_layout(item).name)
        except InputError as err:
            raise InputError("grid_layouts", f"{item[:40]!r}: {err.problem}", err.fix) from None
    flags = []
    for item in _items(deterministic, "grid_deterministic", "on,off"):
        if item.lower() not in _TRUE + _FALSE:
            raise InputError("grid_deterministic", f"{item[:20]!r} is not on or off", "give on, off or on,off")
        flags.append(item.lower() in _TRUE)
    spec = BatchSpec(count=runs, seed_policy=policy, prompts=tuple(prompt_list),
                     seeds=_unique(seed_list, "grid_seeds", "1,2,3"), steps=_unique(step_list, "grid_steps", "4,8"),
                     layouts=_unique(layout_list, "grid_layouts", "sp1-cfg1,sp2-cfg1"),
                     deterministic=_unique(flags, "grid_deterministic", "on,off"))
    if spec.seeds and (runs > 1 or policy != "fixed"):
        raise InputError("grid_seeds", "the grid names the seeds and a count or seed policy varies them too",
                         "give grid seeds with count 1 and seed policy fixed, or drop the grid's seeds")
    if spec.size() > MAX_BATCH_RUNS:
        raise InputError("count", f"the batch makes {spec.size()} runs (the most is {MAX_BATCH_RUNS})",
                         "use fewer runs, prompts or grid values")
    return spec


def prompt_lines(text: str) -> list[str]:
    """A prompt list: one prompt per line, blank lines skipped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_prompts(path: str | Path) -> list[str]:
    """``--prompts FILE``: a UTF-8 text file, one prompt per line; refused when it holds none."""
    prompts = prompt_lines(read_text(Path(path), "prompts", "a text file of prompts, one per line", MAX_PROMPTS_BYTES))
    if not prompts:
        raise InputError("prompts", f"{Path(path).name} holds no prompt", "write one prompt per line")
    return prompts


def expand(base: dict[str, Any], layout: str, spec: BatchSpec) -> list[BatchItem]:
    """The batch's runs in queue order: prompts, then seeds, steps, layouts, deterministic, then the count.

    ``base`` holds the request's fields as typed (its seed may be -1: drawn once for fixed and
    increment, per run for random). The label names only the fields that vary.
    """
    base_seed = whole_number(base.get("seed"), "seed")
    base_seed = 42 if base_seed is None else base_seed
    base_drawn = base_seed == RANDOM_SEED and spec.seed_policy != "random" and not spec.seeds
    if base_drawn:
        base_seed = draw_seed()
    prompts = spec.prompts or (base.get("prompt"),)
    items = []
    for index, (prompt, seed, steps, layout_name, flag, repeat) in enumerate(itertools.product(
            prompts, spec.seeds or (None,), spec.steps or (None,), spec.layouts or (layout,),
            spec.deterministic or (None,), range(spec.count))):
        fields = {**base, "prompt": prompt}
        if spec.prompts:
            fields["prompt_file"] = None  # each line is its own prompt
        drawn = base_drawn
        if seed is not None:
            fields["seed"] = seed
        elif spec.seed_policy == "random":
            fields["seed"], drawn = draw_seed(), True
        elif spec.seed_policy == "increment":
            fields["seed"] = base_seed + repeat
        else:
            fields["seed"] = base_seed
        if steps is not None:
            fields["steps"] = steps
        if flag is not None:
            fields["deterministic"] = flag
        label = []
        if len(prompts) > 1:
            words = " ".join(str(prompt).split())
            label.append(f"prompt {prompts.index(prompt) + 1}: {words[:30]}{'…' if len(words) > 30 else ''}")
        if len(spec.seeds) > 1 or (spec.count > 1 and spec.seed_policy != "fixed"):
            label.append(f"seed {fields['seed']}")
        if len(spec.steps) > 1:
            label.append(f"steps {steps}")
        if len(spec.layouts) > 1:
            label.append(layout_name)
        if len(spec.deterministic) > 1:
            label.append("deterministic" if flag else "not deterministic")
        if spec.count > 1 and spec.seed_policy == "fixed":
            label.append(f"run {repeat + 1} of {spec.count}")
        items.append(BatchItem(fields, layout_name, " · ".join(label) or f"run {index + 1}", drawn))
    return items
