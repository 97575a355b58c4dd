"""Recipe `photos`: a photo import, captured: ImageMagick reads a folder of camera-sized JPEGs
from the filesystem on DEVICE and writes a preview and a thumbnail of each beside them, then
`sync -f` of the filesystem.

The JPEGs are made by ImageMagick itself on the filesystem before the capture (a plasma
fractal, each photo a different roll of it, so no two files hold the same bytes), then the
filesystem is remounted so that the import reads them cold.
"""
import glob

import numpy as np

from traces.capture.recipes import timed
from traces.capture.recipes.common import GIB, MIB, RecipeError, Session, parse_knobs, require, run as sh

DESCRIPTION = ("A photo import: ImageMagick's convert reads each camera-sized JPEG of a folder, "
               "cold, and writes a screen-sized preview and a thumbnail of it, then `sync -f`.")

KNOBS = {
    "photos": (int, 60, "Photos imported (fixed work)."),
    "megapixels": (int, 24, "Size of each photo, 3:2, in megapixels (24: 6000x4000, about 7.5 MB)."),
    "preview": (int, 2048, "Longest side of each preview, pixels."),
    "thumbnail": (int, 256, "Longest side of each thumbnail, pixels."),
    "memory_mb": (int, 512, "Memory cgroup limit for the import, MiB (one decoded 24 MP photo takes "
                            "about 150 MiB)."),
    "seed": (int, 1, "Seed of the plasma fractal and of each photo's roll of it."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}
# Debian's binary by its own name (convert-im6.q16 in bookworm): a plain `convert` first on
# PATH need not be ImageMagick's.
CONVERT = "/usr/bin/convert-im*.q16"
TOOLS = {CONVERT: "imagemagick"}
_QUALITY = 92  # a camera's "fine" JPEG

# The import: each photo decoded once, its preview written from a clone, then its thumbnail;
# a photo that fails stops it.
_IMPORT = ('convert="$1"; size="$2"; thumb="$3"; cd "$4"; mkdir -p previews thumbnails; '
           'for photo in DCIM/*.jpg; do name=${photo##*/}; '
           '"$convert" "$photo" -auto-orient \\( +clone -resize "${size}x${size}" -quality 85 '
           '-write "previews/$name" +delete \\) -thumbnail "${thumb}x${thumb}" -quality 85 "thumbnails/$name" '
           '|| exit; done; sync -f .')


def make_photos(convert: str, folder, scratch, knobs: dict) -> dict:
    """Write knobs["photos"] JPEGs into `folder` with ImageMagick; returns {files, bytes, width,
    height}. The fractal is rendered once into `scratch` (off the device) and rolled per photo."""
    height = int(round((knobs["megapixels"] * 1e6 / 1.5) ** 0.5))
    width = height * 3 // 2
    base = scratch / "plasma.mpc"  # ImageMagick's own pixel cache: read back without decoding
    sh([convert, "-size", f"{width}x{height}", "-seed", knobs["seed"], "plasma:fractal", base],
       what=f"rendering the photos' plasma fractal with ImageMagick ({width}x{height}; a smaller "
            "--megapixels fits the limits of its policy.xml)")
    folder.mkdir()
    rng = np.random.default_rng(knobs["seed"])
    total = 0
    for i in range(knobs["photos"]):
        photo = folder / f"IMG_{i + 1:04d}.jpg"
        sh([convert, base, "-roll", f"+{rng.integers(width)}+{rng.integers(height)}", "-quality", _QUALITY, photo],
           what=f"writing {photo.name} with ImageMagick")
        total += photo.stat().st_size
    return {"files": knobs["photos"], "bytes": total, "width": width, "height": height}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    require(TOOLS, notices)
    convert = sorted(glob.glob(CONVERT))[-1]
    with Session("photos", knobs, notices) as s:
        # The photos (about 0.3 MB per megapixel), their previews and thumbnails, and room to spare.
        dev = s.device(device, destroy_data=destroy_data,
                       scratch_size=max(2 * GIB, knobs["photos"] * knobs["megapixels"] * MIB // 2 + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"imagemagick": sh([convert, "-version"]).stdout.splitlines()[0]}
        s.provenance["photos"] = {"on": "the traced filesystem, written before the capture",
                                  "quality": _QUALITY, **make_photos(convert, mnt / "DCIM", s.tmpdir, knobs)}
        s.remount()  # the photos on the device, none of them in the page cache
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        work = ["sh", "-c", _IMPORT, "import", convert, knobs["preview"], knobs["thumbnail"], mnt]
        s.provenance["workload"] = (f"for each DCIM/*.jpg: {convert.rsplit('/', 1)[-1]} PHOTO -auto-orient "
                                    f"( +clone -resize {knobs['preview']}x{knobs['preview']} -write previews/NAME "
                                    f"+delete ) -thumbnail {knobs['thumbnail']}x{knobs['thumbnail']} "
                                    "thumbnails/NAME; then sync -f")
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            made = {kind: len(list((mnt / kind).glob("*.jpg"))) for kind in ("previews", "thumbnails")}
            if recorded.get("status") == 0 and made["thumbnails"] != knobs["photos"]:
                raise RecipeError(f"the import made {made['thumbnails']} thumbnails of {knobs['photos']} photos")
            elapsed = recorded.get("elapsed_s")
            s.provenance["outcome"] = timed.outcome(
                recorded, photos=made["thumbnails"], previews=made["previews"],
                photos_per_s=made["thumbnails"] / elapsed if elapsed else None,
                unit="photos", reported_by="the timer around the import, and the thumbnails it wrote")
            photos = s.provenance["photos"]
            return (f"{DESCRIPTION} {knobs['photos']} photos of {photos['width']}x{photos['height']} "
                    f"({photos['bytes'] / MIB:.0f} MiB), previews of {knobs['preview']} and thumbnails of "
                    f"{knobs['thumbnail']} pixels, memory limited to {knobs['memory_mb']} MiB, "
                    f"{knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(work)), backend=backend,
                         description=describe, on_start=on_start)
