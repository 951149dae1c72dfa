"""``magi2studio doctor``: what this machine or container can run, and why not.

Every probe is defensive: a missing accelerator, package or engine is a line of the
report, never a crash, so doctor is the first thing to run on a new host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from . import determinism, drift
from .run_folder import provenance
from .engines import ENGINE_NAMES
from .errors import InputError
from .vocabulary.layouts import PRESETS
from .platform import current_platform
from .vocabulary.tiers import TIERS


def mux_tools() -> dict[str, Any]:
    """The ffmpeg CLI (optional) and PyAV with an H.264 + AAC encoder (what runs use to mux)."""

    tools: dict[str, Any] = {"ffmpeg": None, "pyav": None, "h264": False, "aac": False}
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg:
        out = subprocess.run([ffmpeg, "-version"], capture_output=True, text=True, timeout=20).stdout
        tools["ffmpeg"] = out.splitlines()[0] if out else ffmpeg
    try:
        import av

        tools["pyav"] = av.__version__
        for codec, key in (("libx264", "h264"), ("h264", "h264"), ("aac", "aac")):
            try:
                av.codec.Codec(codec, "w")
                tools[key] = True
            except Exception:  # noqa: BLE001 - an absent encoder raises; that is the answer
                pass
    except ImportError as err:
        tools["pyav"] = f"not importable: {err}"
    return tools


def engine_capabilities(platform: str) -> dict[str, Any]:
    """Each engine's tiers and preset layouts here, with the reason where one cannot run."""

    report: dict[str, Any] = {}
    for name in ENGINE_NAMES:  # the server engine probes its URL (3 s at most)
        try:
            from .engines import get_engine

            engine = get_engine(name)
            caps = engine.capabilities()
        except Exception as err:  # noqa: BLE001 - an engine that cannot start here is reported
            report[name] = {"available": False, "reason": f"{err.__class__.__name__}: {err}"}
            continue
        layouts: dict[str, str | None] = {}
        for preset, (layout, _) in PRESETS.items():
            try:
                engine.check_layout(layout, TIERS["272p"])
                layouts[preset] = None
            except InputError as err:
                layouts[preset] = str(err)
            except Exception as err:  # noqa: BLE001
                layouts[preset] = f"{err.__class__.__name__}: {err}"
        report[name] = {"available": True, "platform": caps.platform, "devices": caps.devices,
                        "tiers": caps.tiers, "layouts_272p": layouts, "notes": caps.notes}
    return report


def weights_section(root: str | None, tier: str) -> dict[str, Any] | None:
    env_root = os.environ.get("MAGI2_CKPT_ROOT")
    if not (root or env_root):
        return None
    if not root and not os.path.isdir(env_root):
        # The image names the fixed mount point; only the GPU platforms mount weights there.
        return {"ok": None, "root": env_root, "problems": [],
                "note": "nothing mounted there (the embedded engine needs no weights; vllm-omni does)"}
    from .weights import check_weights

    try:
        return check_weights(root, tier).as_dict()
    except InputError as err:
        return {"ok": False, "problems": [{"path": ".", "problem": str(err)}]}
    except Exception as err:  # noqa: BLE001 - e.g. vLLM-Omni itself does not import
        return {"ok": False, "problems": [{"path": ".", "problem": f"{err.__class__.__name__}: {err}"}]}


def collect(root: str | None = None, tier: str = "272p") -> dict[str, Any]:
    platform = current_platform.report
    return {
        "platform": platform,
        "versions": provenance.package_versions(),
        "build_info": _build_info_summary(),
        "deterministic_env": determinism.recorded(),
        "deterministic_env_expected": determinism.DETERMINISTIC_ENV,
        "cpu_capability": determinism.cpu_capability(),
        "mux": mux_tools(),
        "weights": weights_section(root, tier),
        "engines": engine_capabilities(platform["platform"]),
        "drift": _drift_section(),
    }


def _drift_section() -> dict[str, Any] | None:
    found = drift.check()
    return None if found is None else found.as_dict()


def _build_info_summary() -> dict[str, Any] | None:
    info = provenance.build_info()
    if info is None:
        return None
    return {**{k: v for k, v in info.items() if k != "pip_freeze"}, "pip_freeze_lines": len(info.get("pip_freeze", []))}


def render(report: dict[str, Any]) -> list[str]:
    """The human-readable report, one finding a line."""

    plat = report["platform"]
    lines = [f"platform: {plat['platform']}" + (f" ({plat['problem']})" if plat.get("problem") else "")]
    if plat.get("torchada") or plat.get("torch_musa"):
        lines.append(f"  torchada: {plat['torchada']} (imported at interpreter start: {plat['torchada_first']}); "
                     f"torch_musa: {plat['torch_musa']}")
    for device in plat.get("devices", []):
        lines.append(f"  device: {device}")
    lines.append("versions: " + ", ".join(f"{k} {v or '-'}" for k, v in report["versions"].items()))
    build = report["build_info"]
    if build is None:
        lines.append(f"build-info: none at {provenance.BUILD_INFO_PATH} (not running in the magi2studio image)")
    else:
        lines.append("build-info: " + ", ".join(f"{k}={v}" for k, v in build.items() if v is not None))
    expected = report["deterministic_env_expected"]
    for key, value in report["deterministic_env"].items():
        if key in expected:
            if value == expected[key]:
                state = "ok"
            elif value is None:
                state = f"NOT SET (want {expected[key]}; run `magi2studio env`)"
            else:
                state = f"DIFFERS (want {expected[key]}; unset it or run `magi2studio env`)"
            lines.append(f"deterministic env: {key}={value} {state}")
        else:
            lines.append(f"deterministic env: {key}={value} (engines set a fresh cache per run)")
    mux = report["mux"]
    can_mux = bool(mux["pyav"]) and mux["h264"] and mux["aac"]
    lines.append(f"mux: PyAV {mux['pyav']} (H.264 encoder: {mux['h264']}, AAC: {mux['aac']}) -> "
                 f"{'mp4 with audio can be written' if can_mux else 'cannot write mp4 with audio'}; "
                 f"ffmpeg CLI: {mux['ffmpeg'] or 'not installed (optional)'}")
    weights = report["weights"]
    if weights is None:
        lines.append("weights: not checked (set MAGI2_CKPT_ROOT or pass --root)")
    else:
        state = {True: "ok", False: "NOT OK", None: weights.get("note")}[weights["ok"]]
        lines.append(f"weights: {state} at {weights.get('root', '?')}")
        lines += [f"  {p['path']}: {p['problem']}" for p in weights["problems"]]
    lines += render_drift(report["drift"])
    for name, engine in report["engines"].items():
        if not engine["available"]:
            lines.append(f"engine {name}: not available here ({engine['reason']})")
            continue
        lines.append(f"engine {name}: on {engine['platform']} {engine['devices']}")
        for tier in TIERS:
            reason = engine["tiers"].get(tier, "not offered by this engine")
            lines.append(f"  tier {tier}: {'can run' if reason is None else 'cannot run: ' + reason}")
        runnable = [k for k, v in engine["layouts_272p"].items() if v is None]
        lines.append(f"  layouts (272p) that can run: {', '.join(runnable) or 'none'}")
        for layout, reason in engine["layouts_272p"].items():
            if reason is not None:
                lines.append(f"  layout {layout}: {reason}")
    return lines


def render_drift(found: dict[str, Any] | None, most: int = 40) -> list[str]:
    """The drift verdict: the environment against the image's SBOM and lock, every difference named."""
    if found is None:
        return [f"drift: not checked (no SBOM at {drift.SBOM_PATH}: not running in the magi2studio image)"]
    counted = (f"{found['distributions']} Python distributions ({found['files_checked']} files by their RECORD "
               f"sha256, {found['bytecode_checked']} byte code files against their source), "
               f"{found['debian_packages']} Debian packages")
    if found["ok"]:
        return [f"drift: none: the environment equals the image's SBOM and lock ({counted})"]
    lines = [f"drift: {len(found['differences'])} difference(s) from the image's SBOM and lock ({counted})"]
    lines += [f"  {line}" for line in found["differences"][:most]]
    if len(found["differences"]) > most:
        lines.append(f"  ... and {len(found['differences']) - most} more (magi2studio doctor --json lists all)")
    return lines
