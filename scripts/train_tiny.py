#!/usr/bin/env python3
"""Train the embedded engine's tiny MAGI-2 on captioned scenes from one seed (the DiT on the CPU or a GPU).

    .venv/bin/python scripts/train_tiny.py --work /tmp/train --phase decoders
    .venv/bin/python scripts/train_tiny.py --work /tmp/train --phase dit
    .venv/bin/python scripts/train_tiny.py --work /tmp/train --phase pack --out /tmp/tiny-trained

``--phase all`` runs the three in order. The decoder and DiT phases are independent (the DiT
learns the fixed latent codes, not the decoders' outputs), so they can run one after the
other or side by side; each writes its state and its JSON loss log under ``--work``. ``pack``
writes the checkpoint in the released folder layout (temp folder, then rename), with the
merged loss log as ``training_log.json``, and prints the tree's sha256.
See magi2studio/training/trainer.py for what is trained and how.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    script_started = time.perf_counter()  # --stop-after counts from here: a device call's clock, not training's
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True, type=Path, help="folder for phase states and logs")
    parser.add_argument("--phase", choices=("decoders", "dit", "pack", "all"), default="all")
    parser.add_argument("--out", type=Path, help="checkpoint folder that pack writes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenes", type=int, default=None)
    parser.add_argument("--dit-steps", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--log-every", type=int, default=None)
    parser.add_argument("--noise-shift", type=float, default=None,
                        help="dit: the training noise draw's shift (default: the sampler's 7; 1 draws sigma uniformly, "
                             "so low noise levels come up more often)")
    parser.add_argument("--save-every", type=int, default=0,
                        help="dit: also write dit.pt (and its log) every N steps, as dit.pt's 'step' says")
    parser.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                        help="dit: stop at the first step boundary after this many seconds since this script started "
                             "(the scenes' encoding and the model's load count: a device call's time limit) and "
                             "write dit-state.pt, which --resume continues")
    parser.add_argument("--resume", action="store_true",
                        help="dit: go on from --work's dit-state.pt (same settings); the weights end as an "
                             "uninterrupted run's, bit for bit")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu",
                        help="dit: where the DiT trains (cpu or cuda; batches are drawn on the CPU either way; "
                             "on CUDA with torch's deterministic algorithms)")
    args = parser.parse_args(argv)
    if args.phase in ("pack", "all") and args.out is None:
        parser.error("--out: pack writes the checkpoint there; name a folder, e.g. --out /tmp/tiny-trained")

    if args.noise_shift is not None and not (math.isfinite(args.noise_shift) and args.noise_shift > 0):
        parser.error(f"--noise-shift: {args.noise_shift}; give a positive number, e.g. 1 (sigma uniform) or 7")
    if args.stop_after is not None and args.stop_after <= 0:
        parser.error(f"--stop-after: {args.stop_after} s; give a positive number of seconds")
    state_path = args.work / "dit-state.pt"
    if args.resume and not state_path.is_file():
        parser.error(f"--resume: {state_path} does not exist; run --phase dit with --stop-after or --save-every first")
    if args.device != "cpu":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic GEMMs
    import torch

    kind, _, number = args.device.partition(":")
    if kind not in ("cpu", "cuda") or (number and (kind == "cpu" or not number.isdigit())):
        parser.error(f"--device: {args.device!r} is not a device this trains on; use cpu, cuda or cuda:N")
    if kind == "cuda":
        if int(number or 0) >= torch.cuda.device_count():
            parser.error(f"--device: {args.device} asked, but torch {torch.__version__} sees "
                         f"{torch.cuda.device_count()} CUDA device(s) here; use --device cpu, or cuda:N below that "
                         "count (docs/performance.md, 'Training the tiny DiT on a GPU')")
        torch.use_deterministic_algorithms(True)  # index_add's backward, in upstream's torch MoE, uses atomics
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.checkpoint import ensure_checkpoint
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.tiny_weights import tree_sha256
    from magi2studio.errors import InputError
    from magi2studio.training import latents as codes
    from magi2studio.training import trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in (("scenes", args.scenes), ("dit_steps", args.dit_steps), ("batch", args.batch),
                                   ("log_every", args.log_every), ("noise_shift", args.noise_shift))
                 if v is not None}
    settings = trainer.TrainSettings(seed=args.seed, **overrides)
    config = trainer.trained_config(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    base = ensure_checkpoint(config, args.work / "base")
    torch.manual_seed(args.seed)
    phases = ("decoders", "dit", "pack") if args.phase == "all" else (args.phase,)

    if "decoders" in phases or "dit" in phases:
        upstream_patches.init_world_of_one()  # released when the script exits
        components = load_components(base)
        components.image_encoder.load_state_dict(codes.image_encoder_state(config.spatial_stride))
    if "dit" in phases:  # the decoders are set, not trained: only the DiT learns from scenes
        started = time.perf_counter()
        examples = _examples(args.work, config, settings)
        print(f"{len(examples)} training scenes in {time.perf_counter() - started:.0f} s", flush=True)

    resume = None
    for phase in phases:
        log = trainer.TrainLog(settings.as_dict(), config.digest)
        started = time.perf_counter()
        if phase == "decoders":
            trainer.set_video_decoder(components.video_decoder)
            trainer.set_audio_decoder(components.audio_decoder)
            _save(args.work / "decoders.pt", {"turbo": trainer.turbo_state(components.video_decoder),
                                             "oobleck": trainer.oobleck_state(components.audio_decoder)})
        elif phase == "dit":
            generator = torch.Generator().manual_seed(args.seed + 2)
            if args.resume:
                resume = torch.load(state_path, weights_only=True)
                try:
                    trainer.check_resumable(resume, settings, config.digest)
                except InputError as error:
                    print(error, file=sys.stderr)
                    return 2
                print(f"resuming at step {resume['step']}/{settings.dit_steps}", flush=True)

            def report(step: int, loss: float, snapshot) -> bool:
                if step % settings.log_every == 0:
                    print(f"dit step {step}/{settings.dit_steps} loss {loss:.4f} "
                          f"{time.perf_counter() - started:.0f} s", flush=True)
                stop = args.stop_after is not None and time.perf_counter() - script_started >= args.stop_after
                saving = args.save_every and (step + 1) % args.save_every == 0
                if (stop or saving) and step + 1 < settings.dit_steps:
                    state = snapshot()
                    _save(state_path, state)
                    _save_dit(args.work, state["model"], log, step + 1)
                return stop

            done = trainer.train_dit(components, examples, settings, log, generator, on_step=report,
                                     device=args.device, resume=resume)
            if done < settings.dit_steps:
                print(f"dit: stopped after step {done} of {settings.dit_steps} (--stop-after); "
                      f"{state_path} holds the run; go on with the same command and --resume", flush=True)
                return 0
            _save_dit(args.work, components.transformer.state_dict(), log, settings.dit_steps)
            state_path.unlink(missing_ok=True)  # the run is complete: nothing left to resume
        else:
            missing = [name for name in ("decoders.pt", "dit.pt") if not (args.work / name).is_file()]
            if missing:
                print(f"--work: {args.work} has no {', '.join(missing)}; run --phase decoders and --phase dit first",
                      file=sys.stderr)
                return 2
            decoders = torch.load(args.work / "decoders.pt", weights_only=True)
            dit = torch.load(args.work / "dit.pt", weights_only=True)
            out = trainer.write_trained_checkpoint(base, args.out, config, dit=dit, turbo=decoders["turbo"],
                                                   oobleck=decoders["oobleck"])
            logs = {name: json.loads((args.work / f"log-{name}.json").read_text())
                    for name in ("decoders", "dit") if (args.work / f"log-{name}.json").is_file()}
            (out / "training_log.json").write_text(json.dumps(logs, indent=1), encoding="utf-8")
            size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            print(json.dumps({"checkpoint": str(out), "bytes": size, "sha256": tree_sha256(out)}))
            continue
        earlier = resume["log"]["seconds"].get("dit_train", 0.0) if phase == "dit" and resume else 0.0
        log.seconds[phase] = round(time.perf_counter() - started + earlier, 1)  # a resumed run: all its calls
        _write_text(args.work / f"log-{phase}.json", log.to_json())
        print(f"{phase}: {log.seconds[phase]} s", flush=True)
    return 0


def _examples(work: Path, config, settings) -> list:
    """The training scenes' codes, kept in ``work`` for the next call of the same run (about 80 s for 1024
    scenes on the device's CPU, every call of a run in pieces): the same list ``make_examples`` gives."""

    import numpy as np
    import torch

    from magi2studio.training import trainer

    path = work / f"examples-{settings.seed}-{settings.tier}-{settings.scenes}-{config.digest[:16]}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return [trainer.Example(caption=e["caption"], video=e["video"], audio=e["audio"],
                                first_frame=e["first_frame"].numpy()) for e in saved]
    examples = trainer.make_examples(config, settings)
    _save(path, [{"caption": e.caption, "video": e.video, "audio": e.audio,
                  "first_frame": torch.from_numpy(np.ascontiguousarray(e.first_frame))} for e in examples])
    return examples


def _save_dit(work: Path, model_state: dict, log, steps_done: int) -> None:
    """dit.pt with the steps it has had; the log so far beside it."""

    state = {k: v.detach().to("cpu", copy=True) for k, v in model_state.items()}
    log.seconds["dit_steps_done"] = steps_done
    _save(work / "dit.pt", state)
    _write_text(work / "log-dit.json", log.to_json())


def _save(path: Path, state) -> None:
    import torch

    temp = path.with_name(f".{path.name}.tmp")
    torch.save(state, temp)
    temp.replace(path)


def _write_text(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text, encoding="utf-8")
    temp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
