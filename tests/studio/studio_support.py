"""Helpers shared by the studio tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--autoplay-policy=no-user-gesture-required"]
# Against an external studio (MAGI2STUDIO_URL) the screenshots go to MAGI2STUDIO_SCREENSHOTS.
IMAGES = Path(os.environ.get("MAGI2STUDIO_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "docs" / "images")
NO_CHROMIUM = ("Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium; .ci/run does)")


@contextmanager
def chromium_page(width: int = 1440, height: int = 1000):
    """A page in headless Debian Chromium at ``width`` x ``height``.

    Waits without their own timeout get 90 s, not Playwright's 30: scripts/test runs the image lane (two image
    builds, the image's own studio) beside the rest on CI's 2 cores, and there the image's studio took over 30 s
    to fill its first verdict line after a page load (a wait for an answer, never a timing check)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(90_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def wait_settled(page, element_id: str, timeout_ms: int = 30_000) -> None:
    """Wait until no event is pending on the component (Gradio fades it meanwhile: a screenshot would be grey)."""
    page.wait_for_function(
        "id => { const t = document.querySelector(`#${id} [data-testid=status-tracker]`);"
        " return !t || t.classList.contains('hide'); }", arg=element_id, timeout=timeout_ms)


def submit_from_the_page(page, url: str, prompt: str, seed: int, steps: int, **fields: Any) -> None:
    """Open the studio at 1440x900, fill prompt, seed, steps and any other field (``preview_every=2`` fills
    ``#preview-every``), click Generate."""
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(url)
    page.locator("#job-panel").wait_for()
    page.locator("#prompt textarea").fill(prompt)
    for name, value in {"seed": seed, "steps": steps, **fields}.items():
        page.locator(f"#{name.replace('_', '-')} input").fill(str(value))
    page.locator("#generate").click()


# Small enough to keep the suite quick on two cores; the timing metric needs steps >= 3.
FAST_STEPS = 3


def generate_args(**overrides: Any) -> dict[str, Any]:
    """Every parameter of the /generate endpoint, as the page sends them by default."""
    args = {
        "mode": "t2va", "prompt": "A red kite over a grey sea; gulls cry, wind in the lines.",
        "prompt_file": None, "image": None, "negative_prompt": "", "seed": 7, "tier": "272p",
        "steps": FAST_STEPS, "refiner_steps": None, "preview_every": "", "video_cfg": 5.0, "audio_cfg": 7.0,
        "compile": "engine default", "deterministic": True, "output_width": "", "output_height": "",
        "layout_preset": "sp1-cfg1", "sp": 1, "cfg": 1,
        "ep": None,
    }
    args.update(overrides)
    return args


def everything_under(root: Path) -> set[str]:
    """Every path under the outputs root, hidden temp folders included."""
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_output(job, text: str, timeout_s: float = 60.0) -> None:
    """Until one of the gradio_client job's streamed outputs contains ``text``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(text in str(output) for output in job.outputs()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no output containing {text!r} within {timeout_s} s: {job.outputs()[-1:]}")


@dataclass
class StudioProcess:
    """A ``magi2studio studio`` in its own process (as deployed): its URL, Gradio cache folder (None when its
    first line names none) and process."""

    url: str
    cache: Path | None
    process: subprocess.Popen


@contextmanager
def studio_process(outputs: Path, *, queue_size: int = 8, start_timeout_s: float = 300.0):
    """Serve ``outputs`` with the embedded engine (sp1-cfg1 preloaded) on a free port of 127.0.0.1;
    stopped with SIGTERM at the end if it still runs. Its log goes to ``outputs``' sibling studio.log."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "GRADIO_TEMP_DIR"}
    log = open(Path(outputs).parent / "studio.log", "w", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-c", "from magi2studio.cli import main; raise SystemExit(main())", "studio",
         "--port", str(port), "--out", str(outputs), "--queue-size", str(queue_size), "--preload", "sp1-cfg1"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        started = _started_line(process, start_timeout_s)
        cache = re.search(r"cache (\S+)\)$", started)
        yield StudioProcess(f"http://127.0.0.1:{port}/", Path(cache.group(1)) if cache else None, process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        process.stdout.close()
        log.close()


def _started_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The studio's ``studio: http://...`` line from its stdout (read on, so the pipe never fills)."""
    import queue

    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in iter(process.stdout.readline, ""):
            if line.startswith("studio: "):
                lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"the studio did not start within {timeout_s} s (exit {process.poll()})") from None


@dataclass(frozen=True)
class Answer:
    """What one client of a crowd got first: ``ticket``, ``refused`` (with the refusal), or what went wrong."""

    kind: str
    seconds: float
    text: str = ""


def crowd(url: str, clients: int, *, guard_s: float = 30.0, **overrides: Any) -> list[Answer]:
    """``clients`` plain-HTTP clients call /generate at once (``POST /gradio_api/call/generate``, then its
    event stream), each until its ticket or its refusal; they keep their streams open until every one
    has answered (or ``guard_s`` passed), then all disconnect."""
    import asyncio

    import httpx

    from magi2studio.studio.form import FIELDS

    answered = 0

    async def one(client: httpx.AsyncClient, index: int, everyone: asyncio.Event) -> Answer:
        nonlocal answered
        args = generate_args(**{"seed": 1000 + index, **overrides})
        began = time.monotonic()
        try:
            posted = await client.post(f"{url}gradio_api/call/generate", json={"data": [args[f] for f in FIELDS]})
            event_id = posted.json()["event_id"]
            async with client.stream("GET", f"{url}gradio_api/call/generate/{event_id}") as stream:
                kind = None
                async for line in stream.aiter_lines():
                    if line.startswith("event:"):
                        kind = line.partition(":")[2].strip()
                    elif line.startswith("data:") and kind in ("generating", "error", "complete"):
                        data = line.partition(":")[2].strip()
                        if kind == "generating" and "queued (ticket" not in data:
                            continue
                        took = time.monotonic() - began
                        answered += 1
                        if kind == "generating":
                            await everyone.wait()  # hold the stream: the job stays followed
                            return Answer("ticket", took)
                        error = json.loads(data).get("error") if kind == "error" and data.startswith("{") else data
                        return Answer("refused" if kind == "error" else kind, took, str(error))
            return Answer("stream ended", time.monotonic() - began)
        except Exception as err:  # noqa: BLE001 - every way a client can fail is an answer to count
            answered += 1
            return Answer(type(err).__name__, time.monotonic() - began, str(err)[:200])

    async def all_of_them() -> list[Answer]:
        everyone = asyncio.Event()
        limits = httpx.Limits(max_connections=2 * clients + 4)
        async with httpx.AsyncClient(timeout=guard_s, limits=limits) as client:
            tasks = [asyncio.create_task(one(client, index, everyone)) for index in range(clients)]
            deadline = time.monotonic() + guard_s
            while answered < clients and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            everyone.set()
            return list(await asyncio.gather(*tasks))

    return asyncio.run(all_of_them())
