"""Captioned audio-visual scenes: what a tiny MAGI-2 is trained on and scored against.

A scene is one object (a shape in a colour) on a plain background, travelling along a path
and bouncing, with a beep of one pitch at every bounce. The caption states those facts in
plain English; :func:`parse_caption` reads them back from any of the phrasings the scenes use
and from other ordinary phrasings of the same facts. Clips come at a tier's real size, frame
rate and length, with audio at the rate the engine writes. The same (facts, tier, seed) gives
the same bits: every random choice comes from one seeded generator and the shapes are
rasterised with plain arithmetic on positions rounded to 1/64 pixel.

A fixed set of fact combinations (:data:`HELD_OUT`) is never drawn for training; the
semantic targets are measured on it.

Over 300 lines on purpose: the facts, the captions' writer (:func:`caption_for`), their reader
(:func:`parse_caption`) and the drawing of a scene share one vocabulary, and the reader must
read back every phrasing the writer makes; in one file they change together.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..vocabulary.tiers import AUDIO_CHANNELS, AUDIO_SAMPLE_RATE, TIERS, Tier

# -- the vocabulary ---------------------------------------------------------------------------
SHAPES = ("circle", "square", "triangle")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 190),
    "orange": (245, 140, 30),
    "cyan": (40, 200, 210),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {"grey": (128, 128, 128), "black": (0, 0, 0), "white": (255, 255, 255)}
# Travel along one axis while hopping on the floor or zig-zagging between the side walls;
# or bounce in place (up and down on the floor, side to side between the walls).
MOTIONS = ("left_to_right", "right_to_left", "top_to_bottom", "bottom_to_top", "up_and_down", "side_to_side")
# Hz, two octaves apart: the tones the tiny model's audio decoder sounds at 5 latents/s and five
# strides of 4 (a period-4 carrier at its last two stages, training.latents.audio_pitches).
PITCHES: dict[str, int] = {"low": 320, "high": 1280}

BEEP_SECONDS = 0.12
BEEP_AMPLITUDE = 0.5
_POSITION_QUANTUM = 64  # centres are rounded to 1/64 px so the rasterised bits do not hang on libm


@dataclass(frozen=True, order=True)
class Facts:
    """What a caption says. Scenes state every field; a parsed caption may leave the sound,
    the path or the background unstated (``None``), which the score then does not check."""

    shape: str
    colour: str
    motion: str | None = None
    background: str | None = None
    pitch: str | None = None
    beeps: bool = False  # a beep at each bounce

    @property
    def key(self) -> tuple[str, str, str | None, str | None, str | None]:
        return (self.shape, self.colour, self.motion, self.background, self.pitch)

    @property
    def complete(self) -> bool:
        return None not in self.key and self.beeps


def all_combinations() -> tuple[Facts, ...]:
    """Every complete fact combination the grammar has, in a fixed order."""

    return tuple(Facts(s, c, m, b, p, True)
                 for s, c, m, b, p in itertools.product(SHAPES, COLOURS, MOTIONS, BACKGROUNDS, PITCHES))


# Never trained on. Every shape, colour, path, background and pitch appears here, each in a
# combination the training set never shows, so a score on these measures composition.
HELD_OUT: tuple[Facts, ...] = tuple(Facts(*row, beeps=True) for row in (
    ("circle", "red", "right_to_left", "white", "low"),
    ("circle", "green", "top_to_bottom", "black", "high"),
    ("circle", "blue", "side_to_side", "grey", "low"),
    ("circle", "yellow", "up_and_down", "black", "high"),
    ("circle", "purple", "left_to_right", "white", "high"),
    ("circle", "orange", "bottom_to_top", "grey", "low"),
    ("circle", "cyan", "left_to_right", "black", "low"),
    ("square", "red", "top_to_bottom", "grey", "high"),
    ("square", "green", "left_to_right", "grey", "low"),
    ("square", "blue", "bottom_to_top", "white", "high"),
    ("square", "yellow", "right_to_left", "grey", "low"),
    ("square", "purple", "side_to_side", "black", "high"),
    ("square", "orange", "up_and_down", "white", "low"),
    ("square", "cyan", "top_to_bottom", "white", "high"),
    ("triangle", "red", "left_to_right", "black", "high"),
    ("triangle", "green", "side_to_side", "white", "low"),
    ("triangle", "blue", "up_and_down", "grey", "high"),
    ("triangle", "yellow", "bottom_to_top", "white", "low"),
    ("triangle", "purple", "right_to_left", "grey", "low"),
    ("triangle", "orange", "top_to_bottom", "black", "high"),
    ("triangle", "cyan", "side_to_side", "grey", "high"),
    ("triangle", "red", "up_and_down", "white", "low"),
    ("circle", "orange", "side_to_side", "white", "high"),
    ("square", "blue", "right_to_left", "black", "low"),
))
_HELD_OUT_KEYS = frozenset(f.key for f in HELD_OUT)


def is_held_out(facts: Facts) -> bool:
    """Whether this combination belongs to the fixed held-out set (never trained on)."""

    return facts.key in _HELD_OUT_KEYS


def split_combinations(split: str) -> tuple[Facts, ...]:
    if split == "held_out":
        return HELD_OUT
    if split == "train":
        return tuple(f for f in all_combinations() if not is_held_out(f))
    raise InputError("split", f"unknown split {split!r}", "use train or held_out")


# -- captions ---------------------------------------------------------------------------------
_PATH_WORDS = {
    "left_to_right": ("moves from left to right", "slides left to right", "travels from the left to the right",
                      "hops across from left to right"),
    "right_to_left": ("moves from right to left", "slides right to left", "travels from the right to the left",
                      "hops across from right to left"),
    "top_to_bottom": ("moves from top to bottom", "zig-zags down from the top to the bottom",
                      "travels from the top to the bottom", "drifts top to bottom"),
    "bottom_to_top": ("moves from bottom to top", "zig-zags up from the bottom to the top",
                      "travels from the bottom to the top", "drifts bottom to top"),
    "up_and_down": ("bounces up and down", "hops up and down", "bounces up and down in place",
                    "jumps up and down"),
    "side_to_side": ("bounces from side to side", "moves side to side", "bounces left and right",
                     "slides back and forth between the walls"),
}
_TEMPLATES = (
    "{a} {colour} {shape} {path} on a {background} background; a {pitch} beep each time it bounces",
    "{a} {colour} {shape} {path} over a {background} backdrop, {pitch} beeps on every bounce",
    "on a {background} background {a} {colour} {shape} {path} with a {pitch}-pitched beep at each bounce",
    "{background} background. {A} {colour} {shape} {path}; every bounce makes a {pitch} beep",
)


def caption_for(facts: Facts, phrasing: int = 0) -> str:
    """One of the grammar's phrasings of complete facts (``phrasing`` picks which)."""

    if not facts.complete:
        raise ValueError(f"a scene caption needs complete facts, got {facts}")
    template = _TEMPLATES[phrasing % len(_TEMPLATES)]
    path = _PATH_WORDS[facts.motion][(phrasing // len(_TEMPLATES)) % len(_PATH_WORDS[facts.motion])]
    article = "an" if facts.colour[0] in "aeiou" else "a"
    text = template.format(a=article, A=article.capitalize(), colour=facts.colour, shape=facts.shape, path=path,
                           background=facts.background, pitch=facts.pitch)
    return text[0].upper() + text[1:] if phrasing % 2 else text


PHRASINGS = len(_TEMPLATES) * 4


# -- parsing ----------------------------------------------------------------------------------
_SHAPE_WORDS = {"circle": "circle", "circles": "circle", "ball": "circle", "balls": "circle", "disc": "circle",
                "disk": "circle", "dot": "circle", "round": "circle", "circular": "circle",
                "square": "square", "squares": "square", "box": "square", "block": "square", "cube": "square",
                "triangle": "triangle", "triangles": "triangle", "triangular": "triangle"}
_COLOUR_WORDS = {"red": "red", "crimson": "red", "scarlet": "red", "green": "green", "lime": "green",
                 "blue": "blue", "navy": "blue", "yellow": "yellow", "golden": "yellow", "gold": "yellow",
                 "purple": "purple", "violet": "purple", "magenta": "purple", "orange": "orange",
                 "cyan": "cyan", "turquoise": "cyan", "teal": "cyan", "aqua": "cyan"}
_BACKGROUND_WORDS = {"grey": "grey", "gray": "grey", "silver": "grey", "black": "black", "dark": "black",
                     "white": "white"}
_UNKNOWN_SHAPES = ("star", "hexagon", "pentagon", "rectangle", "oval", "ellipse", "heart", "diamond", "cross")
_UNKNOWN_COLOURS = ("pink", "brown", "beige", "maroon", "olive", "indigo")
_BACKDROP = r"(?:background|backdrop|bg|backround)"
_MOTION_PATTERNS = (  # first match wins: the two-way paths before the one-way ones they contain
    ("up_and_down", r"\b(?:up and down|down and up|up-and-down|bounces? in place|hops? in place)\b"),
    ("side_to_side", r"\b(?:side to side|side-to-side|left and right|right and left|back and forth|to and fro)\b"),
    ("left_to_right", r"\bleft\b(?:\s+\w+){0,2}?\s+(?:to|towards?|into)\s+(?:the\s+)?right\b"),
    ("right_to_left", r"\bright\b(?:\s+\w+){0,2}?\s+(?:to|towards?|into)\s+(?:the\s+)?left\b"),
    ("top_to_bottom", r"\btop\b(?:\s+\w+){0,2}?\s+(?:to|towards?|into)\s+(?:the\s+)?bottom\b"),
    ("bottom_to_top", r"\bbottom\b(?:\s+\w+){0,2}?\s+(?:to|towards?|into)\s+(?:the\s+)?top\b"),
    ("left_to_right", r"\b(?:rightwards?|to the right|moves right|slides right|goes right|heads right)\b"),
    ("right_to_left", r"\b(?:leftwards?|to the left|moves left|slides left|goes left|heads left)\b"),
    ("top_to_bottom", r"\b(?:downwards?|falls|descends|sinks|moves down|goes down|drifts down)\b"),
    ("bottom_to_top", r"\b(?:upwards?|rises|ascends|climbs|moves up|goes up|floats up|drifts up)\b"),
)
_SOUND = r"(?:beeps?|tones?|pings?|blips?|chirps?|boops?|bleeps?|sounds?|notes?)"
_PITCH_PATTERNS = (
    ("high", r"\b(?:high|shrill|treble|squeaky)(?:[- ]pitched)?\b"),
    ("low", r"\b(?:low|deep|bass)(?:[- ]pitched)?\b"),
)
_EXAMPLE = "e.g. 'a red circle moves from left to right on a grey background; a high beep each time it bounces'"


def _words(pattern_words) -> str:
    return r"\b(?:" + "|".join(sorted(map(re.escape, pattern_words), key=len, reverse=True)) + r")\b"


def _the_one(field: str, text: str, known: dict[str, str], unknown: tuple[str, ...], what: str, fix: str) -> str:
    """The one value of ``known`` the text names; else an InputError saying what it named instead."""

    found = {known[w] for w in re.findall(_words(known), text)}
    if not found:
        other = re.findall(_words(unknown), text)
        said = f" ({other[0]!r} is not one)" if other else ""
        raise InputError(field, f"the caption names no {what} this check knows{said}", fix)
    if len(found) > 1:
        raise InputError(field, f"the caption names more than one {field} ({', '.join(sorted(found))})",
                         f"give the one moving object one {field}")
    return found.pop()


def parse_caption(caption: str) -> Facts:
    """Read the scene facts out of a caption. Raises InputError naming the fact it cannot read.

    The object's shape and colour are required; the path, background and sound are read when
    stated. Accepts the scenes' phrasings and ordinary rewordings of them.
    """

    text = " ".join(str(caption).lower().replace(";", " ; ").replace(",", " , ").split())
    if not text:
        raise InputError("caption", "is empty", f"describe the scene, {_EXAMPLE}")

    background, text_wo_bg = None, text
    backdrops = list(re.finditer(r"\b(?:on|over|against|in front of)?\s*(?:an?|the)?\s*((?:\w+[- ])?\w+)\s+"
                                 + _BACKDROP + r"\b", text))
    backdrops += list(re.finditer(_BACKDROP + r"\s+(?:is|of)\s+(\w+)", text))
    for match in backdrops:
        named = [w for w in re.split(r"[- ]", match.group(1)) if w in _BACKGROUND_WORDS or w in _COLOUR_WORDS]
        if not named:
            continue
        word = named[-1]
        if word not in _BACKGROUND_WORDS:
            raise InputError("background", f"the caption's {word!r} background is not one the scenes use",
                             f"use a {', '.join(list(BACKGROUNDS)[:-1])} or {list(BACKGROUNDS)[-1]} background")
        found = _BACKGROUND_WORDS[word]
        if background not in (None, found):
            raise InputError("background", f"the caption names two backgrounds ({background} and {found})",
                             "name one")
        background = found
        text_wo_bg = text_wo_bg.replace(match.group(0), " ; ")

    shape = _the_one("shape", text_wo_bg, _SHAPE_WORDS, _UNKNOWN_SHAPES, "shape",
                     f"make the moving object a {', '.join(SHAPES[:-1])} or {SHAPES[-1]}, {_EXAMPLE}")
    colour = _the_one("colour", text_wo_bg, _COLOUR_WORDS, (*_UNKNOWN_COLOURS, "white", "black", "grey", "gray"),
                      "colour of the moving object", f"use one of {', '.join(COLOURS)}, {_EXAMPLE}")
    motion = next((name for name, pattern in _MOTION_PATTERNS if re.search(pattern, text_wo_bg)), None)
    sound = re.search(r"\b" + _SOUND + r"\b", text_wo_bg) is not None or re.search(r"\bbeep", text_wo_bg) is not None
    pitches = {name for name, pattern in _PITCH_PATTERNS  # "a high(-pitched) beep", "beeping low"
               if re.search(pattern + r"(?:\s+\w+){0,2}?\s*" + _SOUND, text_wo_bg)
               or re.search(r"\b(?:beep\w*|" + _SOUND + r")\s+" + pattern, text_wo_bg)}
    if len(pitches) > 1:
        raise InputError("pitch", "the caption names both a high and a low sound", "give the beeps one pitch")
    beeps = sound and re.search(r"\bbounc", text_wo_bg) is not None
    return Facts(shape=shape, colour=colour, motion=motion, background=background,
                 pitch=pitches.pop() if pitches else None, beeps=bool(beeps))


# -- rendering --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scene:
    """One clip: its facts and caption, the path the object takes, and the bounce times."""

    facts: Facts
    caption: str
    tier: Tier
    seed: int
    half_size: float  # the object's "radius" in pixels (a square's half side is 0.886 of it)
    centres: np.ndarray = field(repr=False)  # float64 [frames, 2]: (x, y) per frame, pixels
    bounce_times: tuple[float, ...] = ()  # seconds; a beep starts at each

    @property
    def fps(self) -> float:
        return self.tier.fps

    @property
    def sample_rate(self) -> int:
        return AUDIO_SAMPLE_RATE

    @property
    def bounce_frames(self) -> tuple[int, ...]:
        return tuple(int(round(t * self.tier.fps)) for t in self.bounce_times)

    def iter_frames(self) -> Iterator[np.ndarray]:
        """The frames one at a time (a 1080p clip is 1.5 GB as one array)."""

        bg = np.array(BACKGROUNDS[self.facts.background], dtype=np.float64)
        fg = np.array(COLOURS[self.facts.colour], dtype=np.float64)
        height, width = self.tier.height, self.tier.width
        blank = np.empty((height, width, 3), dtype=np.uint8)
        blank[:] = BACKGROUNDS[self.facts.background]
        for cx, cy in self.centres:
            frame = blank.copy()
            reach = 1.6 * self.half_size + 2
            x0, x1 = max(0, int(cx - reach)), min(width, int(cx + reach) + 1)
            y0, y1 = max(0, int(cy - reach)), min(height, int(cy + reach) + 1)
            coverage = _coverage(self.facts.shape, self.half_size, np.arange(x0, x1) - cx, np.arange(y0, y1) - cy)
            patch = bg + coverage[..., None] * (fg - bg)
            frame[y0:y1, x0:x1] = np.floor(patch + 0.5).astype(np.uint8)
            yield frame

    def frames(self) -> np.ndarray:
        """uint8 [frames, height, width, 3], the tier's size."""

        return np.stack(list(self.iter_frames()))

    def audio(self) -> np.ndarray:
        """float32 [samples, channels] at the engine's sample rate: a beep at each bounce."""

        rate = AUDIO_SAMPLE_RATE
        total = int(round(self.tier.seconds * rate))
        mono = np.zeros(total, dtype=np.float64)
        beep = _beep(PITCHES[self.facts.pitch])
        for t in self.bounce_times:
            start = int(round(t * rate))
            stop = min(total, start + len(beep))
            mono[start:stop] += beep[:stop - start]
        return np.ascontiguousarray(np.repeat(mono.astype(np.float32)[:, None], AUDIO_CHANNELS, axis=1))


def _coverage(shape: str, r: float, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Fraction of each pixel inside the shape (2x2 supersampling), pixel centres at +0.5."""

    total = np.zeros((len(dy), len(dx)), dtype=np.float64)
    for ox, oy in ((0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)):
        x = (dx + ox)[None, :]
        y = (dy + oy)[:, None]
        if shape == "circle":
            inside = x * x + y * y <= r * r
        elif shape == "square":  # the circle's area: half side r * sqrt(pi) / 2
            half = r * 0.886226925452758
            inside = (np.abs(x) <= half) & (np.abs(y) <= half)
        else:  # an equilateral triangle, apex up, centroid at the centre, the circle's area
            big = r * 1.5551203015562444  # circumradius: sqrt(4 pi / (3 sqrt 3)) r
            inside = (y <= big / 2) & (np.abs(x) * 1.7320508075688772 <= y + big)
        total += inside
    return total / 4.0


@lru_cache(maxsize=4)
def _beep(frequency: int) -> np.ndarray:
    """One beep: a sine at an integer frequency (read from an exact table), 4 ms attack, 30 ms release."""

    rate = AUDIO_SAMPLE_RATE
    table = np.array([math.sin(2.0 * math.pi * k / rate) for k in range(rate)], dtype=np.float64)
    n = np.arange(int(round(BEEP_SECONDS * rate)))
    tone = table[(frequency * n) % rate]
    envelope = np.minimum(1.0, np.minimum(n / (0.004 * rate), (len(n) - n) / (0.030 * rate)))
    return BEEP_AMPLITUDE * tone * envelope


def _seed_for(facts: Facts, tier: Tier, seed: int) -> np.random.Generator:
    material = f"magi2studio-scene|{seed}|{tier.name}|{'|'.join(map(str, facts.key))}".encode()
    return np.random.Generator(np.random.PCG64(int.from_bytes(hashlib.sha256(material).digest()[:8], "little")))


def _across(u: np.ndarray, length: int, margin: float, reverse: bool) -> np.ndarray:
    """Steady travel from one margin to the other over the clip (``u`` runs 0 to 1)."""

    start, end = (length - margin, margin) if reverse else (margin, length - margin)
    return start + (end - start) * u


def _resting(times: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    """A fixed coordinate near the middle."""

    return np.full_like(times, length / 2 + float(rng.uniform(-0.15, 0.15)) * length)


def make_scene(facts: Facts, tier: Tier = TIERS["272p"], seed: int = 0, phrasing: int | None = None) -> Scene:
    """The scene for complete ``facts`` at ``tier``; ``seed`` draws size, speed and start."""

    if not facts.complete:
        raise ValueError(f"a scene needs complete facts, got {facts}")
    rng = _seed_for(facts, tier, seed)
    width, height, seconds = tier.width, tier.height, tier.seconds
    half = float(rng.uniform(0.10, 0.13) * height)
    margin = 1.6 * half + 4
    times = np.arange(tier.frames, dtype=np.float64) / tier.fps
    u = times / seconds
    hop_axis = facts.motion in ("left_to_right", "right_to_left", "up_and_down")
    if hop_axis:  # the floor: n hops, apex at start and end, a bounce at each floor contact
        hops = int(rng.integers(3, 6))
        period = seconds / hops
        bounces = tuple((k + 0.5) * period for k in range(hops))
        lift = float(rng.uniform(0.6, 0.9)) * (height - 2 * margin)
        floor = height - margin
        y = floor - lift * np.abs(np.cos(np.pi * times / period))
        x = (_resting(times, width, rng) if facts.motion == "up_and_down"
             else _across(u, width, margin, reverse=facts.motion == "right_to_left"))
    else:  # the side walls: n round trips from the centre, a bounce at each wall
        trips = int(rng.integers(2, 4))
        period = seconds / trips
        first = 1.0 if rng.integers(0, 2) else -1.0
        bounces = tuple(period * (0.25 + 0.5 * k) for k in range(2 * trips))
        phase = np.mod(times / period - 0.25, 1.0)
        triangle = 4.0 * np.abs(phase - 0.5) - 1.0  # 0 at the start, +-1 at the walls
        x = width / 2 + first * (width / 2 - margin) * triangle
        y = (_resting(times, height, rng) if facts.motion == "side_to_side"
             else _across(u, height, margin, reverse=facts.motion == "bottom_to_top"))
    centres = np.round(np.stack([x, y], axis=1) * _POSITION_QUANTUM) / _POSITION_QUANTUM
    if phrasing is None:
        phrasing = int(rng.integers(0, PHRASINGS))
    return Scene(facts=facts, caption=caption_for(facts, phrasing), tier=tier, seed=seed, half_size=half,
                 centres=centres, bounce_times=tuple(round(t, 6) for t in bounces))


def sample_scenes(seed: int, tier: Tier = TIERS["272p"], split: str = "train") -> Iterator[Scene]:
    """An endless, seeded stream of scenes from one split (the trainer's data)."""

    pool = split_combinations(split)
    rng = np.random.Generator(np.random.PCG64(seed))
    while True:
        facts = pool[int(rng.integers(0, len(pool)))]
        yield make_scene(facts, tier, int(rng.integers(0, 2**62)))
