"""Helpers shared by the studio tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Small enough to keep the suite quick on two cores; the timing metric needs steps >= 3.
FAST_STEPS = 3


def generate_args(**overrides: Any) -> dict[str, Any]:
    """Every parameter of the /generate endpoint, as the page sends them by default."""
    args = {
        "mode": "t2va", "prompt": "A red kite over a grey sea; gulls cry, wind in the lines.",
        "prompt_file": None, "image": None, "negative_prompt": "", "seed": 7, "tier": "272p",
        "steps": FAST_STEPS, "refiner_steps": None, "video_cfg": 5.0, "audio_cfg": 7.0,
        "compile": "engine default", "deterministic": True, "output_width": "", "output_height": "",
        "layout_preset": "sp1-cfg1", "sp": 1, "cfg": 1,
        "ep": None,
    }
    args.update(overrides)
    return args


def everything_under(root: Path) -> set[str]:
    """Every path under the outputs root, hidden temp folders included."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}
