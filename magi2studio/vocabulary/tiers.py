"""Output tiers of MAGI-2 Preview: what each one generates, as upstream and Sand AI define it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class Tier:
    """One output tier.

    ``width``/``height``/``fps``/``frames`` describe the generated clip. A refined tier runs
    its ``preview`` tier first, upsamples and re-noises the latent, then ``refiner_steps``
    refiner steps.
    """

    name: str
    width: int
    height: int
    fps: float
    frames: int
    seconds: float
    steps: int
    preview: str | None = None
    refiner_steps: int = 0
    resized: tuple[tuple[int, int], ...] = ()  # other (width, height) the clip may be resized to

    @property
    def output_sizes(self) -> tuple[tuple[int, int], ...]:
        """The generated size first, then the sizes it may be resized to."""

        return ((self.width, self.height), *self.resized)

    @property
    def refined(self) -> bool:
        return self.preview is not None

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def preview_tier(self) -> Tier:
        """The tier whose clip a refined tier starts from; a one-stage tier is its own."""

        return TIERS[self.preview] if self.refined else self


TIERS: dict[str, Tier] = {
    "272p": Tier("272p", 448, 256, 12.5, 125, 10.0, 100),
    "540p": Tier("540p", 896, 512, 12.5, 125, 10.0, 100),
    # Sand AI's two-stage tier: a 540p preview, upsampled and re-noised, then 5 refiner steps.
    # 1088 rows are generated (a multiple of the 16-pixel latent stride); 1080 is a resize.
    "1080p": Tier("1080p", 1920, 1088, 25.0, 249, 10.0, 100, preview="540p", refiner_steps=5,
                  resized=((1920, 1080),)),
}

AUDIO_SAMPLE_RATE = 44_100
AUDIO_CHANNELS = 2


def get_tier(name: str) -> Tier:
    tier = TIERS.get(str(name).lower())
    if tier is None:
        raise InputError("tier", f"unknown tier {name!r}", f"use one of {', '.join(TIERS)}")
    return tier
