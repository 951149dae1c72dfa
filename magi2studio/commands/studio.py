"""``magi2studio studio``: serve the web studio (Gradio) on one engine."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from ..errors import InputError

log = logging.getLogger(__name__)
AUTH_ENV = "MAGI2STUDIO_AUTH"
# After the followers took their last update, the time Gradio gets to send it before its server stops.
LAST_MESSAGES_S = 1.0
CACHE_SWEEP_S = 600.0  # how often the studio's own Gradio cache is swept of files older than --cache-hours


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """``user:password`` (from --auth or $MAGI2STUDIO_AUTH) -> a login pair, or None."""
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise InputError("auth", "is not user:password", f"write --auth USER:PASSWORD or {AUTH_ENV}=USER:PASSWORD")
    return user, password


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("studio", help="serve the web studio", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--engine", default="embedded", help="embedded (CPU, tiny) or vllm-omni")
    parser.add_argument("--out", type=Path, default=Path("outputs"), help="outputs root for run folders")
    parser.add_argument("--queue-size", type=int, default=32, help="most runs waiting for the engine")
    parser.add_argument("--preload", metavar="LAYOUT", help="start the engine for this layout at launch")
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="GPU memory for the layout memory-fit line")
    parser.add_argument("--cache-hours", type=float, default=24.0,
                        help="files in the studio's own Gradio cache (uploads, the media and zips it served) "
                             "older than this are deleted, checked every 10 minutes (default 24)")
    parser.add_argument("--auth", default=None,
                        help=f"require a login, USER:PASSWORD (or set {AUTH_ENV}); default: no login")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    auth = parse_auth(args.auth or os.environ.get(AUTH_ENV))
    if args.queue_size < 1:
        raise InputError("queue-size", f"{args.queue_size} is below 1", "use --queue-size 1 or more")
    if not args.cache_hours > 0:
        raise InputError("cache-hours", f"{args.cache_hours} is not above 0", "use --cache-hours 1 or more, e.g. 24")
    from ..engines import get_engine
    from ..studio.app import create_app, launch_options
    from ..studio.served import CacheSweeper

    # Gradio's file cache (uploads, the files it serves) is this process's own, removed at exit;
    # /tmp/gradio, shared and never emptied, grew by every run shown. GRADIO_TEMP_DIR set by the user wins.
    gradio_temp = None if os.environ.get("GRADIO_TEMP_DIR") else tempfile.mkdtemp(prefix="magi2studio-gradio-")
    if gradio_temp:
        os.environ["GRADIO_TEMP_DIR"] = gradio_temp
    try:
        engine = get_engine(args.engine)
        demo, ctx = create_app(engine, args.out, max_waiting=args.queue_size, preload=args.preload,
                               gpu_gib=args.gpu_gib)
        cache_folder = Path(os.environ["GRADIO_TEMP_DIR"])
        sweeper = CacheSweeper(cache_folder, args.cache_hours * 3600, CACHE_SWEEP_S) if gradio_temp else None
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True,
                    **launch_options(ctx, auth=auth))
        print(f"studio: http://{args.host}:{args.port} (engine {ctx.capabilities.engine}, "
              f"outputs {ctx.outputs_root}, cache {os.environ['GRADIO_TEMP_DIR']})", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            # The slot first: the running job stops at a step and is marked interrupted, and every client
            # is told so while Gradio still serves; then the server stops.
            ctx.slot.close()
            time.sleep(LAST_MESSAGES_S)
            demo.close()
            engine.close()
            ctx.close()
            if sweeper is not None:
                sweeper.close()
    finally:
        if gradio_temp:
            shutil.rmtree(gradio_temp, ignore_errors=True)
    return 0
