"""The semantic check: does a clip show and sound like its caption says?

Detectors read the decoded frames and audio of a run (or arrays straight from a scene) and
each gives one verdict against the caption's facts (:func:`magi2studio.semantic.scenes.parse_caption`):
the background, the moving object's colour and shape, its path (the centroid track), the
beeps' pitch (the spectral peak) and their timing against the bounces seen in the video
(within ``BEEP_TOLERANCE_FRAMES``), and for I2VA the first frame against the given image (PSNR
against the image scaled to the clip's size). A fact the caption does not
state is reported and not judged. Hashes prove sameness; these verdicts say what a clip shows.

Over 300 lines on purpose: each detector stands next to the thresholds above it and the
:func:`judge` that turns its observation into a verdict, so a threshold is read where it is used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EngineError, InputError
from .scenes import BACKGROUNDS, COLOURS, PITCHES, Facts, parse_caption

BEEP_TOLERANCE_FRAMES = 2
FIRST_FRAME_MIN_PSNR_DB = 20.0
ANALYSIS_HEIGHT = 256  # frames taller than this are subsampled to about this height first
_MASK_THRESHOLD = 60  # sum over channels of |pixel - background|
_TRAVEL = 0.3  # net displacement, as a fraction of the frame, that makes a path one-way
_STRAIGHT = 0.6  # ... when it is at least this share of the distance covered along that axis
# One object moves continuously (a scene's fastest crosses the frame in about 3 s: under 0.03 of it a frame);
# a region that lands more than 0.2 of the frame away from where it was, a frame later, is another region.
# Blotches that jump to new places (issue 28's trained model: 7 distinct images in 125 frames) are no object.
_TELEPORT_DISTANCE, _MAX_TELEPORTS = 0.2, 2
# Shape from fill (area / bounding box: triangle 0.50, circle 0.785, square 1.0) and, for the triangle,
# how far its mass sits below the box's middle (an apex-up triangle: 1/6 of its height; a circle or square:
# 0). Drawn in whole latent cells (the 16-pixel code), a triangle's staircase fills 0.56-0.69 of its box and
# a circle's 0.67-0.89, so fill alone mixed them; fill minus the drop keeps triangles at or below 0.584 and
# circles at or above 0.667 on the 48 held-out codes of seeds 42 and 1000 (docs/training.md).
_TRIANGLE_BELOW, _FILL_SQUARE_ABOVE = 0.625, 0.89


@dataclass(frozen=True)
class Verdict:
    """One attribute: what the caption says, what the detector saw, and whether they agree.

    ``match`` is ``None`` when the caption does not state the attribute (not judged)."""

    attribute: str
    expected: str | None
    observed: str
    match: bool | None
    detail: str = ""
    value: float | None = None  # the measured number where there is one (Hz, dB, share of bounces)

    def line(self) -> str:
        word = {True: "match", False: "MISMATCH", None: "not stated"}[self.match]
        said = f"expected {self.expected}, " if self.expected is not None else ""
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.attribute}: {word} — {said}observed {self.observed}{extra}"


@dataclass(frozen=True)
class Score:
    caption: str
    facts: Facts
    verdicts: tuple[Verdict, ...]

    @property
    def all_match(self) -> bool:
        return all(v.match for v in self.verdicts if v.match is not None)

    def verdict(self, attribute: str) -> Verdict:
        return next(v for v in self.verdicts if v.attribute == attribute)

    def as_dict(self) -> dict[str, Any]:
        return {"caption": self.caption, "facts": asdict(self.facts), "all_match": self.all_match,
                "verdicts": [asdict(v) for v in self.verdicts]}


# -- video ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VideoObservation:
    background: str
    background_rgb: tuple[int, int, int]
    found_fraction: float  # frames in which one object stood out from the background
    colour: str | None
    colour_rgb: tuple[int, int, int] | None
    shape: str | None
    fill: float | None  # object area / its bounding box area (median over frames)
    track: np.ndarray | None  # [frames, 2] centroid (x, y) as fractions of width and height
    motion: str | None
    motion_detail: str
    bounce_frames: tuple[int, ...]
    mass_drop: float | None = None  # centroid below the box's middle / box height (median over frames)


def _nearest(rgb: np.ndarray, palette: dict[str, tuple[int, int, int]]) -> str:
    return min(palette, key=lambda name: float(np.sum((rgb - np.array(palette[name], dtype=np.float64)) ** 2)))


def analyse_video(frames: np.ndarray) -> VideoObservation:
    """Find the background, then per frame the largest region that differs from it."""

    from scipy import ndimage

    step = max(1, int(round(frames.shape[1] / ANALYSIS_HEIGHT)))
    small = frames[:, ::step, ::step]
    count, height, width = small.shape[:3]
    border = np.concatenate([small[:, :3].reshape(-1, 3), small[:, -3:].reshape(-1, 3),
                             small[:, :, :3].reshape(-1, 3), small[:, :, -3:].reshape(-1, 3)])
    bg_rgb = np.median(border, axis=0)
    background = _nearest(bg_rgb, BACKGROUNDS)
    min_area, max_area = 0.004 * height * width, 0.25 * height * width
    centroids = np.full((count, 2), np.nan)
    fills, drops, colours = [], [], []
    for index, frame in enumerate(small):
        mask = np.abs(frame.astype(np.int16) - bg_rgb.astype(np.int16)).sum(axis=2) > _MASK_THRESHOLD
        labels, regions = ndimage.label(mask)
        if regions == 0:
            continue
        sizes = np.bincount(labels.ravel())[1:]
        biggest = int(np.argmax(sizes)) + 1
        area = int(sizes[biggest - 1])
        if not min_area <= area <= max_area:
            continue
        ys, xs = np.nonzero(labels == biggest)
        centroids[index] = (xs.mean() + 0.5) / width, (ys.mean() + 0.5) / height
        box_height = float(ys.max() - ys.min() + 1)
        fills.append(area / float((xs.max() - xs.min() + 1) * box_height))
        drops.append((ys.mean() + 0.5 - (ys.min() + ys.max() + 1) / 2) / box_height)
        colours.append(np.median(frame[ys, xs], axis=0))
    found = float(np.mean(~np.isnan(centroids[:, 0])))
    bg_tuple = tuple(int(round(c)) for c in bg_rgb)
    if found < 0.5:
        return VideoObservation(background, bg_tuple, found, None, None, None, None, None, None,
                                f"an object stood out in {found:.0%} of the frames", ())
    seen_at = np.nonzero(~np.isnan(centroids[:, 0]))[0]
    per_frame = np.linalg.norm(np.diff(centroids[seen_at], axis=0), axis=1) / np.diff(seen_at)
    teleports = int(np.sum(per_frame > _TELEPORT_DISTANCE))
    if teleports > _MAX_TELEPORTS:
        return VideoObservation(background, bg_tuple, found, None, None, None, None, None, None,
                                f"what stood out jumped to a new place {teleports} times (over "
                                f"{_TELEPORT_DISTANCE:.0%} of the frame in one frame): blotches, not one moving object",
                                ())
    rgb = np.median(np.stack(colours), axis=0)
    fill, drop = float(np.median(fills)), float(np.median(drops))
    triangular = fill - max(drop, 0.0) < _TRIANGLE_BELOW
    shape = "triangle" if triangular else "square" if fill > _FILL_SQUARE_ABOVE else "circle"
    valid = ~np.isnan(centroids[:, 0])
    track = np.stack([np.interp(np.arange(count), np.nonzero(valid)[0], centroids[valid, axis]) for axis in (0, 1)],
                     axis=1)
    motion, detail = classify_motion(track)
    return VideoObservation(background, bg_tuple, found, _nearest(rgb, COLOURS), tuple(int(round(c)) for c in rgb),
                            shape, fill, track, motion, detail, bounce_frames(track), drop)


def classify_motion(track: np.ndarray) -> tuple[str, str]:
    """One-way travel if an axis's net displacement is large and most of the distance it
    covers (``net/path``, on a 5-frame median of the track), else the axis it oscillates along."""

    from scipy.ndimage import median_filter

    edge = max(1, len(track) // 10)
    start, end = np.median(track[:edge], axis=0), np.median(track[-edge:], axis=0)
    net = end - start
    path = np.abs(np.diff(median_filter(track, size=(5, 1), mode="nearest"), axis=0)).sum(axis=0)
    straight = np.abs(net) / np.maximum(path, 1e-9)
    spread = np.percentile(track, 95, axis=0) - np.percentile(track, 5, axis=0)
    detail = (f"net dx {net[0]:+.2f} dy {net[1]:+.2f}, net/path x {straight[0]:.2f} y {straight[1]:.2f}, "
              f"range x {spread[0]:.2f} y {spread[1]:.2f} of the frame")
    one_way = [axis for axis in (0, 1) if abs(net[axis]) >= _TRAVEL and straight[axis] >= _STRAIGHT]
    if one_way:
        axis = max(one_way, key=lambda a: abs(net[a]))
        if axis == 0:
            return ("left_to_right" if net[0] > 0 else "right_to_left"), detail
        return ("top_to_bottom" if net[1] > 0 else "bottom_to_top"), detail
    if spread.max() < 0.1:
        return "still", detail
    return ("up_and_down" if spread[1] > spread[0] else "side_to_side"), detail


# A decoder may make fewer pictures than the clip has frames (the 16-pixel code: 49 for 125), each then shown
# for 2-3 frames; a centroid that moves less than this (fraction of the frame) from one frame to the next is
# the same picture shown again.
_SAME_PICTURE = 1e-3
# A turn is a bounce when the object spends little time near it: within _NEAR_TURN of the axis's range of the
# turning point for under _BOUNCE_DWELL times what that distance takes at its local mean speed. A reversal at
# steady speed gives 2, a hop's top about 4 (it slows down and lingers). On the 16-pixel code's 49 pictures of
# 120 held-out scenes (seeds 42, 1000, 2000, 3000, 4000 + index) every one of the 561 contacts gave 1.61-2.40
# and every other turn 2.80-4.55; drawn at the full frame rate 1.85-2.10 and 3.90-4.18 (docs/training.md).
# A bounce must also reverse sharply, as before: the position's change over the w frames before it and the w
# after differs by over w times the axis's median speed a frame (w = 2 frames, or two pictures' holds). At the
# full frame rate that rejects a sine's turns (0.33-0.72 of it), which the dwell alone puts at 2.50-2.75.
_NEAR_TURN, _BOUNCE_DWELL = 0.25, 2.6


def shown_pictures(track: np.ndarray) -> tuple[np.ndarray, float]:
    """The track with each picture at the moment it stands for, the frames between two pictures moving
    linearly from one to the next. Read frame by frame, a picture held for 2-3 frames looks like a stop.

    A run of one position twice the clip's usual hold is two pictures that happen to be alike. The
    engine's pictures stand for moments evenly spaced from the clip's first frame to its last
    (``training.latents.decoded_frame_times``) and each is shown over an equal share of the frames, so
    a picture stands for the point as far through its share as the share is through the clip. A clip
    at the full frame rate comes back as it was. Also how many frames a picture is shown for."""

    count = len(track)
    moved = np.any(np.abs(np.diff(track, axis=0)) > _SAME_PICTURE, axis=1)
    starts = np.concatenate([[0], np.nonzero(moved)[0] + 1])
    lengths = np.diff(np.append(starts, count))
    hold = count / len(starts)
    pictures = np.maximum(1, np.round(lengths / hold)).astype(np.int64)
    hold = count / int(pictures.sum())  # runs of two alike pictures no longer lengthen the hold
    pictures = np.maximum(1, np.round(lengths / hold)).astype(np.int64)
    share = np.repeat(lengths / pictures, pictures)
    first = np.concatenate([start + np.arange(n) * length / n for start, length, n in zip(starts, lengths, pictures)])
    times = first + (share - 1) * np.clip(first / np.maximum(count - share, 1), 0, 1)
    values = np.repeat(track[starts], pictures, axis=0)
    return np.stack([np.interp(np.arange(count), times, values[:, axis]) for axis in (0, 1)], axis=1), hold


def _leaves(gap: np.ndarray, start: int, distance: float, step: int) -> float | None:
    """The (interpolated) frame at which ``gap`` first reaches ``distance`` going from ``start`` by ``step``."""

    i = start
    while 0 <= i + step < len(gap):
        if gap[i + step] >= distance:
            return i + step * (distance - gap[i]) / (gap[i + step] - gap[i])
        i += step
    return None


def turns(track: np.ndarray) -> list[tuple[int, int, float, float]]:
    """Each turning point of the :func:`shown_pictures` track: (frame, axis, dwell, flip). Dwell is the time
    spent within ``_NEAR_TURN`` of the axis's range of it over what that distance takes at the local
    mean speed (over the dwell and as long again each side); flip is the change of the position's change
    from the w frames before it to the w after, over w times the axis's median speed a frame. Turns too
    near the clip's ends are left out."""

    from scipy.signal import find_peaks

    track, hold = shown_pictures(track)
    w = max(2, int(round(2 * hold)))
    found = []
    for axis in (0, 1):
        position = track[:, axis]
        step = np.abs(np.diff(position))
        median = float(np.median(step))
        spread = float(position.max() - position.min())
        near = _NEAR_TURN * spread
        for sign in (1.0, -1.0):
            peaks, _ = find_peaks(sign * position, prominence=max(0.05, 0.25 * spread), distance=3)
            for i in peaks:
                gap = sign * (position[i] - position)
                before, after = _leaves(gap, int(i), near, -1), _leaves(gap, int(i), near, 1)
                if before is None or after is None or i < w or i + w >= len(position) or median <= 0:
                    continue
                dwell = after - before
                speed = float(step[max(0, int(before - dwell)):int(math.ceil(after + dwell))].mean())
                flip = abs(2 * position[i] - position[i - w] - position[i + w]) / (w * median)
                found.append((int(i), axis, dwell * speed / near, flip))
    return found


def bounce_frames(track: np.ndarray) -> tuple[int, ...]:
    """Frames where the object reverses abruptly along an axis (a wall or floor contact).

    A smooth turn (the top of a hop) is not a bounce: the object slows down there and stays near the
    turning point about twice as long as at a contact, which it reaches and leaves at speed, and its
    position's change turns over gradually."""

    merged: list[int] = []
    for frame in sorted(frame for frame, _, dwell, flip in turns(track) if dwell < _BOUNCE_DWELL and flip > 1.0):
        if not merged or frame - merged[-1] > BEEP_TOLERANCE_FRAMES:
            merged.append(frame)
    return tuple(merged)


# -- audio ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AudioObservation:
    onsets: tuple[float, ...]  # seconds at which a beep starts
    peak_hz: float
    pitch: str
    loud_share: float = 0.0  # share of the clip within 12 dB of its loudest moment: near 1 for one continuous tone


# Beeps are short (a few per clip); a sound loud for most of the clip is a tone, not beeps.
CONTINUOUS_TONE_SHARE = 0.5


_HOP_SECONDS = 0.005


def analyse_audio(audio: np.ndarray, sample_rate: int) -> AudioObservation:
    """Beep onsets from the short-time loudness; the pitch from the spectrum of the beeps."""

    mono = np.asarray(audio, dtype=np.float64)
    mono = mono.mean(axis=1) if mono.ndim == 2 else mono
    hop = max(1, int(round(_HOP_SECONDS * sample_rate)))
    usable = len(mono) // hop * hop
    loudness = np.sqrt(np.mean(mono[:usable].reshape(-1, hop) ** 2, axis=1))
    peak = float(loudness.max()) if len(loudness) else 0.0
    threshold = max(0.25 * peak, 4.0 * float(np.median(loudness)) if len(loudness) else 0.0, 1e-3)
    loud = loudness >= threshold
    onsets: list[float] = []
    refractory = int(round(0.1 / _HOP_SECONDS))
    last = -refractory
    for i in np.nonzero(loud & ~np.concatenate([[False], loud[:-1]]))[0]:
        if i - last >= refractory:
            onsets.append(i * hop / sample_rate)
        last = i
    segments = mono[:usable].reshape(-1, hop)[loud].ravel() if loud.any() else mono
    spectrum = np.abs(np.fft.rfft(segments * np.hanning(len(segments)))) if len(segments) > 1 else np.zeros(2)
    freqs = np.fft.rfftfreq(len(segments), 1.0 / sample_rate) if len(segments) > 1 else np.zeros(2)
    band = (freqs >= 100) & (freqs <= 8000)
    peak_hz = float(freqs[band][np.argmax(spectrum[band])]) if band.any() else 0.0
    boundary = math.sqrt(PITCHES["low"] * PITCHES["high"])
    loud_share = float(np.mean(loudness >= 0.25 * peak)) if peak > 1e-3 else 0.0
    return AudioObservation(tuple(onsets), peak_hz, "low" if peak_hz < boundary else "high", loud_share)


def match_beeps(bounces: tuple[int, ...], onsets_frames: list[int]) -> tuple[list[int], int]:
    """Pair each bounce with the nearest free beep within the tolerance (closest pairs first).

    Returns the signed offsets (beep minus bounce, frames) of the paired bounces and the
    number of beeps left unpaired."""

    pairs = sorted(((abs(o - b), bi, oi, o - b) for bi, b in enumerate(bounces) for oi, o in enumerate(onsets_frames)
                    if abs(o - b) <= BEEP_TOLERANCE_FRAMES))
    used_b, used_o, offsets = set(), set(), {}
    for _, bi, oi, offset in pairs:
        if bi not in used_b and oi not in used_o:
            used_b.add(bi)
            used_o.add(oi)
            offsets[bi] = offset
    return [offsets[b] for b in sorted(offsets)], len(onsets_frames) - len(used_o)


# -- I2VA -------------------------------------------------------------------------------------
def first_frame_psnr(frame: np.ndarray, image_path: str | Path) -> float:
    """PSNR (dB) of the first frame against the input image scaled (Lanczos) to the frame's size."""

    from PIL import Image

    with Image.open(image_path) as image:
        scaled = image.convert("RGB").resize((frame.shape[1], frame.shape[0]), resample=Image.Resampling.LANCZOS)
    mse = float(np.mean((frame.astype(np.float64) - np.asarray(scaled, dtype=np.float64)) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)


# -- the verdicts -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """What the detectors saw and heard in one clip, before any caption is consulted."""

    video: VideoObservation
    audio: AudioObservation
    fps: float
    first_frame_psnr: float | None = None  # I2VA only


def observe(frames: np.ndarray, audio: np.ndarray, fps: float, sample_rate: int, *,
            reference_image: str | Path | None = None) -> Observation:
    """Run every detector over one clip (uint8 [F,H,W,3], float [S,C])."""

    psnr = None if reference_image is None else first_frame_psnr(frames[0], reference_image)
    return Observation(analyse_video(frames), analyse_audio(audio, sample_rate), fps, psnr)


def judge(facts: Facts, seen: Observation, caption: str = "") -> Score:
    """The per-attribute verdicts of an observation against a caption's facts."""

    video, heard = seen.video, seen.audio
    verdicts = [Verdict("background", facts.background, f"{video.background} {video.background_rgb}",
                        None if facts.background is None else video.background == facts.background)]
    if video.colour is None:
        missing = f"no object ({video.motion_detail})"
        verdicts += [Verdict(a, getattr(facts, a), missing, False if getattr(facts, a) is not None else None)
                     for a in ("colour", "shape", "motion")]
    else:
        verdicts += [
            Verdict("colour", facts.colour, f"{video.colour} {video.colour_rgb}", video.colour == facts.colour),
            Verdict("shape", facts.shape, video.shape, video.shape == facts.shape,
                    f"fill {video.fill:.2f}, mass {video.mass_drop:+.2f} of its height below its middle"),
            Verdict("motion", facts.motion, video.motion,
                    None if facts.motion is None else video.motion == facts.motion, video.motion_detail),
        ]
    verdicts.append(Verdict("pitch", facts.pitch, heard.pitch,
                            None if facts.pitch is None else heard.pitch == facts.pitch,
                            f"spectral peak {heard.peak_hz:.0f} Hz", heard.peak_hz))
    beep_frames = [int(round(t * seen.fps)) for t in heard.onsets]
    offsets, extra = match_beeps(video.bounce_frames, beep_frames)
    bounces = len(video.bounce_frames)
    within = len(offsets) / bounces if bounces else 0.0
    observed = f"{len(offsets)}/{bounces} bounces with a beep within ±{BEEP_TOLERANCE_FRAMES} frames, {extra} extra"
    detail = (f"bounce frames {list(video.bounce_frames)}, beep frames {beep_frames}"
              if len(beep_frames) <= 20 else f"{len(beep_frames)} beeps heard")
    matched = bounces > 0 and within == 1.0 and extra == 0
    if not bounces:  # not "0/0 bounces": nothing in the video to time the beeps against
        observed = f"no bounce seen in the video, {len(beep_frames)} beeps heard"
    if heard.loud_share >= CONTINUOUS_TONE_SHARE:  # not "0/0 bounces": say what is heard
        observed = f"a continuous tone (loud for {heard.loud_share:.0%} of the clip), no separate beeps"
        matched, within = False, 0.0
    verdicts.append(Verdict("beeps", "at each bounce" if facts.beeps else None, observed,
                            matched if facts.beeps else None, detail, within))
    if seen.first_frame_psnr is not None:
        psnr = seen.first_frame_psnr
        verdicts.append(Verdict("first_frame", f">= {FIRST_FRAME_MIN_PSNR_DB:.0f} dB PSNR against the image",
                                f"{psnr:.1f} dB", psnr >= FIRST_FRAME_MIN_PSNR_DB, value=psnr))
    return Score(caption, facts, tuple(verdicts))


def score_clip(facts: Facts, frames: np.ndarray, audio: np.ndarray, fps: float, sample_rate: int, *,
               reference_image: str | Path | None = None, caption: str = "") -> Score:
    """Every verdict for one clip against parsed facts."""

    return judge(facts, observe(frames, audio, fps, sample_rate, reference_image=reference_image), caption)


def score_run(path: str | Path) -> Score:
    """Score a run folder against the prompt it was made from."""

    from ..run_folder import runs
    from ..media import decode_mp4

    folder = runs.load_run(Path(path))
    request = folder.manifest["request"]
    caption = request["prompt"]
    facts = parse_caption(caption)
    image = request.get("image") if request.get("mode") == "i2va" else None
    if image is not None and not Path(image).is_file():
        raise InputError("image", f"the run's first-frame image {image} is not there",
                         "score from the folder the run was made in, or put the image back at that path")
    try:
        frames, audio, fps, sample_rate = decode_mp4(folder.video.read_bytes())
    except EngineError as err:
        raise InputError("video.mp4", f"{folder.video} could not be read ({err})",
                         "score a complete run folder written by magi2studio") from None
    return score_clip(facts, frames, audio, fps, sample_rate, reference_image=image, caption=caption)
