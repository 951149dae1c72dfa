"""``magi2studio generate``: one request, headless, into a run folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..vocabulary.paths import read_text
from ..vocabulary.request import (MAX_PROMPT_FILE_BYTES, RANDOM_SEED, Request, build_request_seeding, read_prompt_file,
                                  whole_number)

DEFAULT_OUT = Path("outputs")
MAX_REQUEST_BYTES = 2 * MAX_PROMPT_FILE_BYTES  # a request holds its prompt and a negative prompt


# engines/embedded/tiny_weights.py's choices, spelled here so that parsing the command imports no engine
WEIGHTS_HELP = ("embedded engine: trained (the shipped trained checkpoint), random (seeded weights) or a tiny "
                "checkpoint folder (default: $MAGI2_EMBEDDED_WEIGHTS, else trained)")


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", help="the prompt text")
    parser.add_argument("--prompt-file", help="a UTF-8 text or JSON prompt file (stripped, passed through)")
    parser.add_argument("--image", help="first-frame image: makes the request I2VA")
    parser.add_argument("--negative-prompt", help="default: the engine's (upstream's DEFAULT_NEGATIVE_PROMPT)")
    parser.add_argument("--tier", default=None, help="272p, 540p or 1080p (default 272p)")
    parser.add_argument("--seed", default=None, help="whole number (default 42); -1 draws one, which the run records")
    parser.add_argument("--steps", default=None, help="denoising steps (default: the engine's)")
    parser.add_argument("--refiner-steps", default=None, help="1080p refiner steps (default 5)")
    parser.add_argument("--preview-every", default=None,
                        help="steps between live previews (default: about 10 a run; 0: off)")
    parser.add_argument("--output-width", default=None, help="delivered width (default: the tier's generated size)")
    parser.add_argument("--output-height", default=None,
                        help="delivered height: 1080p generates 1088; 1080 resizes it (default: generated)")
    parser.add_argument("--compile", choices=("static", "dynamic", "eager"), default=None)
    parser.add_argument("--request", help="a request YAML file; flags given here override its fields")


def request_from_args(args: argparse.Namespace) -> Request:
    fields: dict = {}
    if args.request:
        path = Path(args.request)
        text = read_text(path, "request", "a request YAML file", MAX_REQUEST_BYTES)
        fields = Request.from_yaml(text, source="request", root=path.resolve().parent).model_dump()
    if args.prompt is not None and args.prompt_file:
        raise InputError("prompt", "both --prompt and --prompt-file were given", "give one of them")
    if args.prompt is not None:
        fields.update(prompt=args.prompt, prompt_file=None)
    elif args.prompt_file:
        fields.update(prompt=read_prompt_file(args.prompt_file), prompt_file=args.prompt_file)
    if "prompt" not in fields:
        raise InputError("prompt", "no prompt was given", "give --prompt TEXT, --prompt-file PATH or --request FILE")
    if args.image:
        fields.update(image=args.image, mode="i2va")
    for key, value in (("negative_prompt", args.negative_prompt), ("tier", args.tier), ("compile", args.compile)):
        if value is not None:
            fields[key] = value
    for key in ("seed", "steps", "refiner_steps", "preview_every", "output_width", "output_height"):
        value = whole_number(getattr(args, key), key)
        if value is not None:
            fields[key] = value
    return build_request_seeding(**fields)[0]


def seed_asked_random(args: argparse.Namespace) -> bool:
    """``--seed -1``: :func:`request_from_args` drew the request's seed."""
    return whole_number(args.seed, "seed") == RANDOM_SEED


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``--engine vllm-omni-server`` (a running ``vllm-omni serve ... --omni``)."""

    group = parser.add_argument_group("vllm-omni-server engine")
    group.add_argument("--server-url", help="the server (default $MAGI2STUDIO_SERVER_URL or http://127.0.0.1:8000)")
    group.add_argument("--server-layout", help="the layout the server was launched with "
                       "(default $MAGI2STUDIO_SERVER_LAYOUT; "
                       "unset: the --layout of the first run is assumed, since the server does not report it)")
    group.add_argument("--server-metrics-dir", help="the server workers' MAGI2STUDIO_METRICS_DIR, shared here: "
                       "per-step timings (default $MAGI2STUDIO_SERVER_METRICS_DIR; unset: none)")
    group.add_argument("--server-transport", choices=("async", "sync"), default="async",
                       help="async: POST /v1/videos and poll (cancellable); sync: POST /v1/videos/sync")
    group.add_argument("--server-timeout", type=float, default=7200.0, help="seconds a job may take (default 7200)")
    group.add_argument("--server-compile", choices=("static", "dynamic", "eager"), default=None,
                       help="the compile mode the server was launched with (default dynamic, upstream's)")


def engine_options(args: argparse.Namespace) -> dict:
    """Keyword arguments for get_engine: only the server engine takes any from the command line."""

    if args.engine == "embedded":
        return {"weights": args.weights} if getattr(args, "weights", None) else {}
    if args.engine != "vllm-omni-server":
        return {}
    return {"server_url": args.server_url, "server_layout": args.server_layout,
            "metrics_dir": args.server_metrics_dir, "transport": args.server_transport,
            "request_timeout_s": args.server_timeout, "server_compile": args.server_compile}


def register(sub) -> None:
    parser = sub.add_parser("generate", help="generate one clip into a run folder")
    add_request_arguments(parser)
    parser.add_argument("--layout", default="sp1-cfg1", help="spN-cfgM[-epK] or a preset")
    parser.add_argument("--engine", default="embedded", help="embedded, vllm-omni or vllm-omni-server")
    parser.add_argument("--weights", default=None,
                        help=WEIGHTS_HELP)
    add_server_arguments(parser)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="outputs root (default ./outputs)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..run_folder import runs
    from ..engines import get_engine
    from ..vocabulary.layouts import parse_layout
    from .progress import ConsoleProgress

    request = request_from_args(args)
    layout = parse_layout(args.layout)
    engine = get_engine(args.engine, **engine_options(args))
    # The plan checks the request and layout before the outputs root is made or the engine starts.
    # Closing the engine lets go of what it holds (an in-process world, ranks, a child), also when
    # main() runs in-process.
    try:
        plan = engine.plan(request, layout)
        if seed_asked_random(args):
            plan = plan.with_seed_drawn()
            print(f"seed: -1 drew {request.seed}", file=sys.stderr)
        with ConsoleProgress() as progress:
            folder = runs.execute_plan(engine, plan, Path(args.out), on_progress=progress)
    finally:
        engine.close()
    print_summary(folder)
    return 0


def print_summary(folder) -> None:
    manifest = folder.manifest
    preview = manifest["timing"]["stages"].get("preview", {})
    gate = preview.get("gate_ms")
    print(f"run folder: {folder.path}")
    print(f"engine: {manifest['engine']['name']}  layout: {manifest['layout']['name']}  "
          f"steps: {manifest['resolved']['steps']}")
    print(f"frames sha256: {manifest['hashes']['frames_sha256']}")
    print(f"pcm sha256:    {manifest['hashes']['pcm_sha256']}")
    if gate is not None:
        print(f"gate: {gate:.1f} ms/step (median {preview['median_ms']:.1f}, min {preview['min_ms']:.1f}, "
              f"max {preview['max_ms']:.1f}; steps 0-1 excluded)")
    stages = ", ".join(f"{k} {v:.0f} ms" for k, v in manifest["timing"]["stage_ms"].items())
    print(f"stages: {stages}", file=sys.stdout)
