"""Recipe `video`: a video export, captured: ffmpeg reads a large camera-like video from the
filesystem on DEVICE and transcodes it to H.264 (libx264) into a new file beside it, then
`sync -f` of the filesystem.

The source is made by ffmpeg itself on the filesystem before the capture (its testsrc2 pattern
and a sine tone, MPEG-4 Part 2 at a camera's bitrate), then the filesystem is remounted so
that the export reads it cold.
"""
import re

from traces.capture.recipes import timed
from traces.capture.recipes.common import GIB, MIB, RecipeError, Session, parse_knobs, require, run as sh

DESCRIPTION = ("A video export: ffmpeg reads a large 1080p video, cold, and transcodes it to H.264 "
               "(libx264) into a new file, then `sync -f`.")

KNOBS = {
    "seconds": (int, 90, "Length of the source video, seconds at 30 frames/s (fixed work; 90 s of "
                         "1080p is about 320 MB)."),
    "height": (int, 1080, "Height of the source video, 16:9, pixels."),
    "preset": (str, "veryfast", "libx264 preset of the export."),
    "crf": (int, 23, "libx264 constant rate factor of the export (lower is larger and better)."),
    "threads": (int, 2, "ffmpeg threads of the export, decoding and encoding."),
    "memory_mb": (int, 512, "Memory cgroup limit for the export, MiB (the page cache counts, so the "
                            "source cannot stay cached)."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}
TOOLS = {"ffmpeg": "ffmpeg"}
_RATE = 30
_SOURCE_QUALITY = 2  # MPEG-4 Part 2 qscale: near-lossless, about 28 Mbit/s at 1080p
# ffmpeg's progress line, last one for the whole run: "frame= 2700 fps= 80 q=-1.0 Lsize= ..."
_FRAMES = re.compile(r"frame=\s*(\d+)")


def make_source(path, knobs: dict) -> dict:
    """Write the source video to `path` with ffmpeg; returns {bytes, width, height, frames}."""
    height = knobs["height"] - knobs["height"] % 2
    width = (height * 16 // 9) // 2 * 2
    seconds = knobs["seconds"]
    sh(["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-f", "lavfi", "-i", f"testsrc2=size={width}x{height}:rate={_RATE}:duration={seconds}",
        "-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration={seconds}",
        "-c:v", "mpeg4", "-q:v", _SOURCE_QUALITY, "-c:a", "aac", "-b:a", "192k", path],
       what=f"writing the {width}x{height} source video with ffmpeg")
    return {"bytes": path.stat().st_size, "width": width, "height": height, "frames": seconds * _RATE,
            "seconds": seconds, "codec": f"mpeg4 -q:v {_SOURCE_QUALITY}, aac 192k"}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    require(TOOLS, notices)
    with Session("video", knobs, notices) as s:
        # The source (about 3.6 MB per second of 1080p), the export, and room to spare.
        pixels = knobs["height"] ** 2 * 16 // 9
        dev = s.device(device, destroy_data=destroy_data,
                       scratch_size=max(2 * GIB, 2 * knobs["seconds"] * pixels + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"ffmpeg": sh(["ffmpeg", "-version"]).stdout.splitlines()[0]}
        source, export = mnt / "source.mp4", mnt / "export.mp4"
        s.provenance["source_video"] = {"on": "the traced filesystem, written before the capture",
                                        **make_source(source, knobs)}
        s.remount()  # the source on the device, none of it in the page cache
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        threads = str(knobs["threads"])
        transcode = ["ffmpeg", "-nostdin", "-hide_banner", "-threads", threads, "-i", source,
                     "-c:v", "libx264", "-preset", knobs["preset"], "-crf", knobs["crf"], "-threads", threads,
                     "-c:a", "copy", export]
        work = ["sh", "-c", '"$@" && sync -f "$(dirname "$0")"', export, *transcode]
        s.provenance["workload"] = " ".join(map(str, transcode)).replace(str(mnt), "MOUNTPOINT") + "; then sync -f"
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            frames = [int(f) for f in _FRAMES.findall(recorded.get("output", ""))]
            expected = s.provenance["source_video"]["frames"]
            if recorded.get("status") == 0 and (not frames or frames[-1] != expected):
                raise RecipeError(f"the export wrote {frames[-1] if frames else 'no'} frames of {expected}")
            elapsed = recorded.get("elapsed_s")
            made = frames[-1] if frames else None
            s.provenance["outcome"] = timed.outcome(
                recorded, frames=made, output_bytes=export.stat().st_size if export.exists() else None,
                frames_per_s=made / elapsed if made and elapsed else None,
                unit="frames", reported_by="the timer around the export, ffmpeg's frame count and the file it wrote")
            video = s.provenance["source_video"]
            return (f"{DESCRIPTION} {video['seconds']} s of {video['width']}x{video['height']} at {_RATE} "
                    f"frames/s ({video['bytes'] / MIB:.0f} MiB, MPEG-4 Part 2 and AAC) to libx264 "
                    f"{knobs['preset']} crf {knobs['crf']} with {knobs['threads']} threads, memory limited "
                    f"to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(work)), backend=backend,
                         description=describe, on_start=on_start)
