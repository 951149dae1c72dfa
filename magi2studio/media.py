"""A generation as files and back: H.264 + AAC mp4 (written and decoded), 16-bit WAV, a poster, array hashes."""

from __future__ import annotations

import hashlib
import io
import wave
from fractions import Fraction
from pathlib import Path

import numpy as np

from .errors import EngineError

AAC_FRAME = 1024


def frames_sha256(frames: np.ndarray) -> str:
    """sha256 of the decoded frames as uint8 [F, H, W, 3], C order (the MUSA report's image hash)."""

    return hashlib.sha256(np.ascontiguousarray(frames, dtype=np.uint8).tobytes()).hexdigest()


def pcm_sha256(audio: np.ndarray) -> str:
    """sha256 of the PCM as float32 [samples, channels], C order (the MUSA report's audio hash)."""

    return hashlib.sha256(np.ascontiguousarray(audio, dtype=np.float32).tobytes()).hexdigest()


def latents_sha256(video: np.ndarray, audio: np.ndarray) -> str:
    """sha256 of the final latents as float32, video [1, C, T, H, W] then audio [1, T, C], C order.

    They are what the sampler made, before decoding rounds them to uint8 frames and resampled
    PCM, so they show a difference in the last bit that the frames may hide.
    """

    digest = hashlib.sha256()
    for array in (video, audio):
        digest.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fps_fraction(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1000)


def write_mp4(path: Path, frames: np.ndarray, audio: np.ndarray, fps: float, sample_rate: int,
              metadata: dict[str, str]) -> None:
    """Mux frames (uint8 [F,H,W,3]) and audio (float32 [S,C]) into one mp4."""

    import av

    height, width = frames.shape[1:3]
    channels = audio.shape[1]
    with av.open(str(path), "w", format="mp4") as container:
        for key, value in metadata.items():
            container.metadata[key] = value
        video = container.add_stream("libx264", rate=_fps_fraction(fps))
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        # Fixed encoder settings and one thread keep the file bytes reproducible.
        video.options = {"crf": "18", "preset": "veryfast"}
        video.codec_context.thread_count = 1
        layout = "stereo" if channels == 2 else "mono"
        sound = container.add_stream("aac", rate=sample_rate, layout=layout)
        sound.codec_context.thread_count = 1
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        planar = np.ascontiguousarray(np.clip(audio, -1.0, 1.0).T.astype(np.float32))
        for start in range(0, planar.shape[1], AAC_FRAME):
            chunk = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(planar[:, start:start + AAC_FRAME]), format="fltp", layout=layout
            )
            chunk.sample_rate = sample_rate
            chunk.pts = start
            for packet in sound.encode(chunk):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)


def write_wav(path: Path, audio: np.ndarray, sample_rate: int) -> None:
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    with wave.open(str(path), "wb") as file:
        file.setnchannels(audio.shape[1])
        file.setsampwidth(2)
        file.setframerate(sample_rate)
        file.writeframes(pcm.tobytes())


def write_poster(path: Path, frames: np.ndarray) -> None:
    """The middle frame as a JPEG, encoded in memory and written by Python: Pillow's encoder ignores a short
    write (a full disk, ``ulimit -f``) and would leave a cut poster behind; Python's write raises."""

    from PIL import Image

    encoded = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frames[len(frames) // 2])).save(encoded, format="JPEG", quality=90)
    Path(path).write_bytes(encoded.getvalue())


def decode_mp4(data: bytes) -> tuple[np.ndarray, np.ndarray, float, int]:
    """mp4 bytes -> frames uint8 [F,H,W,3], audio float32 [samples, channels], fps, sample rate."""

    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video or not container.streams.audio:
                raise EngineError(f"the server's mp4 has {len(container.streams.video)} video and "
                                  f"{len(container.streams.audio)} audio streams; MAGI-2 returns one of each")
            video_stream = container.streams.video[0]
            fps = float(video_stream.average_rate or video_stream.guessed_rate)
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        with av.open(io.BytesIO(data)) as container:
            audio_stream = container.streams.audio[0]
            sample_rate = int(audio_stream.rate)
            chunks = []
            for frame in container.decode(audio=0):
                array = frame.to_ndarray()
                if not frame.format.is_planar:  # interleaved: [1, samples * channels]
                    array = array.reshape(-1, len(frame.layout.channels)).T
                chunks.append(array.astype(np.float32, copy=False))
    except av.error.FFmpegError as err:
        raise EngineError(f"the server's mp4 could not be decoded ({err})") from None
    if not frames or not chunks:
        raise EngineError("the server's mp4 has no decodable frames or audio")
    audio = np.ascontiguousarray(np.concatenate(chunks, axis=1).T)
    return np.ascontiguousarray(np.stack(frames)), audio, fps, sample_rate
