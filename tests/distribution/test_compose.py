"""compose.yaml validates against the compose-spec schema for each MAGI2_PLATFORM value.

Compose resolves ``${VAR:-default}`` and then ``extends`` before validating; this test does
the same (only the subset compose.yaml uses) and validates the result with the compose-spec
JSON schema that the check-jsonschema package vendors.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from magi2studio.cli import build_parser

from . import image_contract as contract

ROOT = Path(__file__).resolve().parents[2]
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(node, env: dict[str, str]):
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if isinstance(node, str):
        return _VAR.sub(lambda m: env.get(m[1]) or (m[2] or ""), node)
    return node


def merge(base, override):
    """Compose's extends merge for what compose.yaml uses: mappings merge, volume lists add."""

    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(override, list):
        return base + [item for item in override if item not in base]
    return override


def load_project(env: dict[str, str]) -> dict:
    project = interpolate(yaml.safe_load((ROOT / "compose.yaml").read_text()), env)
    for name, service in project["services"].items():
        extends = service.pop("extends")
        platforms = interpolate(yaml.safe_load((ROOT / extends["file"]).read_text()), env)
        if extends["service"] not in platforms["services"]:
            raise LookupError(f"cannot extend service {extends['service']!r} in {extends['file']}: "
                              f"MAGI2_PLATFORM must be one of {', '.join(platforms['services'])}")
        project["services"][name] = merge(copy.deepcopy(platforms["services"][extends["service"]]), service)
    return project


def compose_schema() -> dict:
    text = resources.files("check_jsonschema").joinpath("builtin_schemas/vendor/compose-spec.json").read_text()
    return json.loads(text)


@pytest.mark.parametrize("platform", ["cpu", "cuda", "musa"])
def test_compose_validates_for_each_platform(platform):
    env = {} if platform == "cpu" else {"MAGI2_PLATFORM": platform}
    project = load_project(env)
    jsonschema.validate(project, compose_schema())
    platforms = yaml.safe_load((ROOT / "image" / "compose" / "platforms.yaml").read_text())
    jsonschema.validate(interpolate(platforms, env), compose_schema())
    studio = project["services"]["studio"]
    assert studio["build"]["args"]["MAGI2_PLATFORM"] == platform
    assert studio["ports"] == ["7860:7860"] and studio["restart"] == "unless-stopped"
    assert "127.0.0.1:7860/health/ready'" in " ".join(studio["healthcheck"]["test"])  # readiness, as the image's
    assert {"type": "volume", "source": "outputs", "target": "/outputs"} in studio["volumes"]
    weights = [v for v in studio["volumes"] if v["target"] == "/models/MAGI-2-preview"]
    dockerfile_cmd = re.search(r"^CMD (\[.*\])$", (ROOT / "image" / "Dockerfile").read_text(), re.M)[1]
    served = build_parser().parse_args(studio.get("command") or json.loads(dockerfile_cmd))
    assert (served.command, served.host, served.port, str(served.out)) == ("studio", "0.0.0.0", 7860, "/outputs")
    if platform == "cpu":
        assert served.engine == "embedded" and not weights and "deploy" not in studio
        return
    assert served.engine == "vllm-omni" and studio["ipc"] == "host"
    assert weights and weights[0]["read_only"] is True
    assert studio["environment"]["MAGI2_CKPT_ROOT"] == "/models/MAGI-2-preview"
    if platform == "cuda":
        assert studio["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    else:
        assert studio["runtime"] == "mthreads"
        assert {"MTHREADS_VISIBLE_DEVICES", "MTHREADS_DRIVER_CAPABILITIES"} <= set(studio["environment"])


def test_unknown_platform_is_named():
    with pytest.raises(LookupError, match=r"'rocm'.*MAGI2_PLATFORM must be one of cpu, cuda, musa"):
        load_project({"MAGI2_PLATFORM": "rocm"})


def test_schema_rejects_a_broken_service():
    project = load_project({})
    project["services"]["studio"]["restart"] = ["always"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(project, compose_schema())


def compose_run_spec(studio: dict, platform: str) -> dict:
    """What `docker compose up` gives the studio container, in image_contract's terms."""

    env = {key: value.replace("${MAGI2_PLATFORM}", platform) for key, value in contract.dockerfile_env().items()
           if key != "PATH"}
    reservations = studio.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    devices = reservations[0] if reservations else ({"runtime": studio["runtime"]} if "runtime" in studio else {})
    return {
        "build_args": studio["build"]["args"],
        "mounts": {volume["target"]: bool(volume.get("read_only", False)) for volume in studio["volumes"]},
        "user": studio.get("user") or re.findall(r"^USER (\S+)$", contract.DOCKERFILE, re.M)[-1],
        "ports": [int(port.rsplit(":", 1)[1]) for port in studio["ports"]],
        "devices": devices,
        "environment": env | studio.get("environment", {}),
    }


@pytest.mark.parametrize("platform", ["cpu", "cuda", "musa"])
def test_compose_gives_the_container_what_the_image_test_checks(platform):
    digest, commit = "sha256:" + "ab" * 32, "cd" * 20
    env = {} if platform == "cpu" else {"MAGI2_PLATFORM": platform, "MAGI2_BASE_DIGEST": digest,
                                        "MAGI2_VLLM_OMNI_COMMIT": commit}
    studio = load_project(env)["services"]["studio"]
    pins = () if platform == "cpu" else (digest, commit)
    assert compose_run_spec(studio, platform) == contract.run_spec(platform, *pins)


def test_compose_drift_is_caught():
    studio = load_project({})["services"]["studio"]
    studio["volumes"][0]["target"] = "/data"
    studio["environment"] = {"MAGI2STUDIO_OUTPUTS": "/data"}
    spec = compose_run_spec(studio, "cpu")
    assert spec["mounts"] != contract.mounts("cpu") and spec["environment"] != contract.environment("cpu")
