"""Recipe `office`: a desktop application launched from a cold cache, captured: LibreOffice
(Debian's headless packages) starts from the filesystem on DEVICE and converts a folder of
documents there, text and web pages to PDF in one launch and spreadsheets to XLSX in a second.

Before the capture the installation is copied onto the filesystem: /usr/lib/libreoffice with
its links followed, every shared library its programs and components load (ldd's closure, run
through LD_LIBRARY_PATH), the fonts fontconfig lists (through a fonts.conf of its own) and a
user profile and font cache made by one launch there; the documents are written beside it.
The filesystem is then remounted, so the captured launches read the application cold.
"""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from traces.capture.recipes import timed
from traces.capture.recipes.common import GIB, MIB, RecipeError, Session, parse_knobs, require, version_of
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("An application launch from a cold cache: LibreOffice, installed on the filesystem, "
               "starts and converts a folder of text documents and web pages to PDF, then starts "
               "again and converts spreadsheets to XLSX.")

KNOBS = {
    "documents": (int, 30, "Documents converted (fixed work): a third each text (.fodt), web page "
                           "(.html) and spreadsheet (.csv)."),
    "kib": (int, 48, "Size of each document, KiB."),
    "memory_mb": (int, 1024, "Memory cgroup limit for the conversions, MiB (LibreOffice's memory "
                             "and the page cache count)."),
    "seed": (int, 1, "Seed of the documents' words and figures."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}

INSTALL = Path("/usr/lib/libreoffice")
SOFFICE = INSTALL / "program" / "soffice"
TOOLS = {str(SOFFICE): "libreoffice-core-nogui", str(INSTALL / "program" / "libswlo.so"): "libreoffice-writer-nogui",
         str(INSTALL / "program" / "libsclo.so"): "libreoffice-calc-nogui", "fc-list": "fontconfig",
         "ldd": "libc-bin"}
KINDS = (("text", "fodt", "pdf"), ("web", "html", "pdf"), ("sheet", "csv", "xlsx"))
_WORDS = ("drive latency replay trace block request queue flush sector cache write read page "
          "journal extent inode commit barrier device kernel storage transfer merge sequence "
          "workload capture timing causal offset length column").split()
# Launch 1: text and web pages to PDF; launch 2: spreadsheets to XLSX; then the outputs reach
# the device. The profile, fonts and temporary files are all on the traced filesystem.
_CONVERT = ('root="$1"; cd "$root"; soffice="$root/libreoffice/program/soffice"; '
            'profile="-env:UserInstallation=file://$root/home/profile"; '
            '"$soffice" --headless --norestore "$profile" --convert-to pdf --outdir out docs/*.fodt docs/*.html '
            '&& "$soffice" --headless --norestore "$profile" --convert-to xlsx --outdir out docs/*.csv '
            '&& sync -f .')


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def copy_installation(root: Path) -> dict:
    """LibreOffice, the system libraries it loads and the fonts, copied under `root`;
    returns {files, bytes, libraries, fonts}."""
    office = root / "libreoffice"
    shutil.copytree(INSTALL, office, symlinks=False)  # Debian's links into /etc and /usr/share followed
    # Debian's fundamentalrc names /usr/lib/libreoffice and /etc/libreoffice/registry; the copy
    # finds itself as upstream's does, from the program's own directory.
    rc = office / "program" / "fundamentalrc"
    text = rc.read_text().replace("file:///usr/lib/libreoffice", "${ORIGIN}/..")
    rc.write_text(text.replace("file:///etc/libreoffice/registry", "${BRAND_BASE_DIR}/share/registry"))
    libraries = set()
    for path in office.rglob("*"):
        if path.is_file() and _is_elf(path):
            done = subprocess.run(["ldd", path], capture_output=True, text=True)
            for line in done.stdout.splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/") \
                        and not parts[2].startswith(str(root)):
                    libraries.add(parts[2])
    lib = root / "lib"
    lib.mkdir()
    for library in sorted(libraries):
        shutil.copy2(library, lib / Path(library).name)
    fonts_dir = root / "fonts"
    fonts_dir.mkdir()
    listed = sh(["fc-list", ":", "file"]).stdout.split("\n")
    fonts = sorted({line.strip().rstrip(":") for line in listed if line.strip()})
    for i, font in enumerate(fonts):
        shutil.copy2(font, fonts_dir / f"{i:03d}-{Path(font).name}")
    (root / "fonts.conf").write_text(
        f'<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
        f"  <dir>{fonts_dir}</dir>\n  <cachedir>{root / 'fontcache'}</cachedir>\n</fontconfig>\n")
    files = [p for p in root.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "libraries": len(libraries), "fonts": len(fonts),
            "from": f"{INSTALL} (links followed), ldd's closure of its ELF files, fc-list's fonts"}


def _words(rng, count: int) -> str:
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), count))


def _text(rng, size: int, n: int) -> str:
    head = ('<?xml version="1.0" encoding="UTF-8"?>\n<office:document '
            'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
            'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.3" '
            'office:mimetype="application/vnd.oasis.opendocument.text">\n<office:body><office:text>\n'
            f'<text:h text:outline-level="1">Report {n}</text:h>\n')
    tail = "</office:text></office:body></office:document>\n"
    body = []
    while len(head) + sum(map(len, body)) + len(tail) < size:
        if len(body) % 8 == 0:
            body.append(f'<text:h text:outline-level="2">{_words(rng, 4).title()}</text:h>\n')
        body.append(f"<text:p>{_words(rng, int(rng.integers(40, 120)))}.</text:p>\n")
    return head + "".join(body) + tail


def _web(rng, size: int, n: int) -> str:
    head = f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Page {n}</title></head><body>\n<h1>Page {n}</h1>\n"
    tail = "</body></html>\n"
    body = []
    while len(head) + sum(map(len, body)) + len(tail) < size:
        if len(body) % 6 == 5:
            cells = "".join(f"<tr><td>{_words(rng, 2)}</td><td>{v}</td></tr>" for v in rng.integers(0, 10**6, 8))
            body.append(f"<table border=\"1\">{cells}</table>\n")
        else:
            body.append(f"<p>{_words(rng, int(rng.integers(40, 120)))}.</p>\n")
    return head + "".join(body) + tail


def _sheet(rng, size: int, n: int) -> str:
    rows = ["item,region,quantity,price,total\n"]
    while sum(map(len, rows)) < size:
        i = len(rows)
        quantity, price = int(rng.integers(1, 1000)), int(rng.integers(100, 100_000)) / 100
        rows.append(f"{_WORDS[i % len(_WORDS)]}-{n}-{i},{_WORDS[int(rng.integers(0, 8))]},{quantity},"
                    f"{price:.2f},=C{i + 1}*D{i + 1}\n")
    return "".join(rows)


def make_documents(folder: Path, knobs: dict) -> dict:
    """knobs["documents"] documents in `folder`, a third of each kind, the same bytes for the
    same knobs; returns {files, bytes, per kind: count}."""
    rng = np.random.default_rng(knobs["seed"])
    makers = {"text": _text, "web": _web, "sheet": _sheet}
    counts = {kind: 0 for kind, _ext, _to in KINDS}
    total = 0
    for n in range(knobs["documents"]):
        kind, ext, _to = KINDS[n % len(KINDS)]
        data = makers[kind](rng, knobs["kib"] * 1024, n).encode()
        (folder / f"{kind}-{n:03d}.{ext}").write_bytes(data)
        counts[kind] += 1
        total += len(data)
    return {"files": knobs["documents"], "bytes": total, **counts}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    if knobs["documents"] < len(KINDS):
        raise RecipeError(f"knob documents: {knobs['documents']} is too few; give at least {len(KINDS)}, "
                          "one of each kind (text, web page, spreadsheet)")
    require(TOOLS, notices)
    with Session("office", knobs, notices) as s:
        dev = s.device(device, destroy_data=destroy_data, scratch_size=2 * GIB)
        mnt = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"libreoffice": version_of(SOFFICE, "--version")}
        s.provenance["installation"] = {"on": "the traced filesystem, copied before the capture",
                                        **copy_installation(mnt)}
        for folder in ("docs", "out", "home", "tmp"):
            (mnt / folder).mkdir()
        s.provenance["documents"] = make_documents(mnt / "docs", knobs)
        env = {**os.environ, "HOME": str(mnt / "home"), "TMPDIR": str(mnt / "tmp"),
               "LD_LIBRARY_PATH": str(mnt / "lib"), "FONTCONFIG_FILE": str(mnt / "fonts.conf"),
               "SAL_USE_VCLPLUGIN": "svp"}
        # One launch first makes the user profile and the font cache, as a user's earlier
        # sessions would have; the captured launches find them and start as any later one does.
        sh([mnt / "libreoffice" / "program" / "soffice", "--headless", "--norestore", "--terminate_after_init",
            f"-env:UserInstallation=file://{mnt}/home/profile"], env=env, cwd=mnt, timeout=300,
           what="the first launch of LibreOffice from the filesystem")
        s.remount()  # the application and the documents on the device, none of them in the page cache
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        work = ["env", *(f"{k}={env[k]}" for k in ("HOME", "TMPDIR", "LD_LIBRARY_PATH", "FONTCONFIG_FILE",
                                                   "SAL_USE_VCLPLUGIN")),
                "sh", "-c", _CONVERT, "office", mnt]
        s.provenance["workload"] = ("cd MOUNTPOINT; libreoffice/program/soffice --headless --norestore "
                                    "--convert-to pdf --outdir out docs/*.fodt docs/*.html && "
                                    "libreoffice/program/soffice --headless --norestore --convert-to xlsx "
                                    "--outdir out docs/*.csv; then sync -f (profile in MOUNTPOINT/home, "
                                    "TMPDIR, LD_LIBRARY_PATH and FONTCONFIG_FILE on the filesystem)")
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            documents = s.provenance["documents"]
            made = {to: len(list((mnt / "out").glob(f"*.{to}"))) for to in ("pdf", "xlsx")}
            converted = made["pdf"] + made["xlsx"]
            if recorded.get("status") == 0 and converted != documents["files"]:
                raise RecipeError(f"LibreOffice converted {converted} of {documents['files']} documents")
            elapsed = recorded.get("elapsed_s")
            s.provenance["outcome"] = timed.outcome(
                recorded, documents=converted, pdf=made["pdf"], xlsx=made["xlsx"],
                output_bytes=sum(p.stat().st_size for p in (mnt / "out").iterdir()),
                documents_per_s=converted / elapsed if elapsed else None, launches=2,
                unit="documents", reported_by="the timer around both launches, and the files they wrote")
            install = s.provenance["installation"]
            return (f"{DESCRIPTION} {s.provenance['applications']['libreoffice']} ({install['bytes'] / MIB:.0f} MiB "
                    f"in {install['files']} files with its libraries and fonts), {documents['files']} documents "
                    f"of {knobs['kib']} KiB, memory limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(work)), backend=backend,
                         description=describe, on_start=on_start)
