"""Generate one clip through a running studio's ``/generate`` endpoint and print what it made.

    python docs/examples/generate_api.py http://127.0.0.1:7860/ "A red kite over a grey sea"
    python docs/examples/generate_api.py URL PROMPT --seed 7 --steps 8 --image first-frame.png

Only the prompt is needed: every other field of the endpoint has the page's default (docs/studio.md,
"The API"). The last line is JSON: the video, the WAV, the run id and the hashes the run promises.
"""

from __future__ import annotations

import argparse
import json

from gradio_client import Client, handle_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the studio's address, e.g. http://127.0.0.1:7860/")
    parser.add_argument("prompt")
    parser.add_argument("--seed", type=int, help="default: the page's (42)")
    parser.add_argument("--steps", type=int, help="default: the page's (the engine's demo or real default)")
    parser.add_argument("--image", help="a first frame: makes the run I2VA")
    args = parser.parse_args()

    fields = {"prompt": args.prompt}
    if args.seed is not None:
        fields["seed"] = args.seed
    if args.steps is not None:
        fields["steps"] = args.steps
    if args.image:
        fields.update(mode="i2va", image=handle_file(args.image))
    video, wav, manifest, *_ = Client(args.url, verbose=False).predict(**fields, api_name="/generate")
    print(json.dumps({"video": video["video"] if isinstance(video, dict) else video, "wav": wav,
                      "run_id": manifest["run_id"], "request": manifest["request"],
                      "hashes": manifest["hashes"]}))


if __name__ == "__main__":
    main()
