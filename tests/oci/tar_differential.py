#!/usr/bin/env python3
"""A corpus of odd tar headers and what two independent extractors make of each.

Usage: tar_differential.py OUTDIR

Writes OUTDIR/NAME.tar for every case and OUTDIR/cases.json: a list of
{"name", "file", "must_accept", "gnu", "python"} where "gnu" is what GNU tar
(`tar -xf`) writes and "python" what Python's tarfile names, each a map from
the hex of a regular file's path bytes to the SHA-256 of its contents, or null
when that extractor refuses the archive. The C++ test (oci_test.cc,
OciTarLayer.AcceptedArchivesNameWhatGnuTarAndPythonTarfileWrite) reads each
archive with the layer reader and requires: an archive it accepts gives exactly
the files both extractors write (docs/interop.md, "Tar headers").
"""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

BLOCK = 512


def header(name, typeflag=b"0", size=0, magic=b"ustar\x0000", prefix=b"", at=None,
           link=b""):
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = b"0000644\x00"
    h[108:116] = b"0000000\x00"
    h[116:124] = b"0000000\x00"
    h[124:136] = b"%011o\x00" % size
    h[136:148] = b"14745555555\x00"
    h[156:157] = typeflag
    h[157:157 + len(link)] = link
    h[257:265] = magic
    h[345:345 + len(prefix)] = prefix
    for offset, data in (at or {}).items():
        h[offset:offset + len(data)] = data
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\x00 " % sum(h)
    return bytes(h)


def pad(data):
    return data + b"\x00" * (-len(data) % BLOCK)


def entry(name, data=b"", **kw):
    return header(name, size=len(data), **kw) + pad(data)


def pax(records, typeflag=b"x"):
    body = b""
    for key, value in records:
        rec = b" " + key + b"=" + value + b"\n"
        n = len(rec) + 1
        while len(str(n).encode()) + len(rec) != n:
            n = len(str(n).encode()) + len(rec)
        body += str(n).encode() + rec
    return entry(b"PaxHeader", body, typeflag=typeflag)


def longname(name, typeflag=b"L"):
    return entry(b"././@LongLink", name + b"\x00", typeflag=typeflag,
                 magic=b"ustar  \x00")


END = b"\x00" * (2 * BLOCK)
GOOD = b'{"good": 1}'
EVIL = b'{"evil": 1}'


def crafted():
    """Archives written byte by byte: (name, bytes, must_accept); must_accept None: the
    reader may refuse it, and must give what both extractors write if it does not."""
    yield "ustar-prefix", entry(b"config.json", GOOD, prefix=b"deep/dir") + END, True
    yield "ustar-full-name-and-prefix", entry(b"n" * 100, GOOD, prefix=b"p" * 155) + END, True
    yield "name-with-bytes-after-its-nul", entry(b"a.json\x00garbage", GOOD) + END, True
    yield "not-utf8-name", entry(b"caf\xe9.json", GOOD) + END, True
    yield "pax-path", pax([(b"path", b"long/" + b"x" * 150 + b".json")]) + entry(
        b"short", GOOD) + END, True
    yield "pax-size", pax([(b"size", b"%d" % len(GOOD))]) + header(
        b"sized.json", size=0) + pad(GOOD) + END, True
    yield "gnu-long-name", longname(b"long/" + b"y" * 150 + b".json") + entry(
        b"short", GOOD, magic=b"ustar  \x00") + END, True
    yield "directory-then-file", entry(b"d/", typeflag=b"5") + entry(b"d/a.json", GOOD) + END, True
    # Old-GNU headers keep atime and ctime where ustar keeps the name prefix.
    yield "oldgnu-atime-at-345", entry(
        b"config.json", GOOD, magic=b"ustar  \x00",
        at={345: b"14745555555\x00", 357: b"14745555555\x00"}) + END, False
    yield "v7-bytes-at-345", entry(b"config.json", GOOD, magic=b"\x00" * 8,
                                    prefix=b"evil") + END, False
    yield "ustar-magic-other-version-prefix", entry(
        b"config.json", GOOD, magic=b"ustar\x00  ", prefix=b"evil") + END, False
    # star keeps atime and ctime after a 131-byte prefix.
    yield "star-times-after-prefix", entry(
        b"config.json", GOOD, prefix=b"dir",
        at={476: b"14745555555 ", 488: b"14745555555 "}) + END, False
    yield "pax-path-then-gnu-long-name", pax([(b"path", b"a.json")]) + longname(
        b"b.json") + entry(b"c.json", GOOD) + END, False
    yield "gnu-long-name-then-pax-path", longname(b"b.json") + pax(
        [(b"path", b"a.json")]) + entry(b"c.json", GOOD) + END, False
    yield "two-gnu-long-names", longname(b"a.json") + longname(b"b.json") + entry(
        b"c.json", GOOD) + END, False
    yield "two-pax-headers", pax([(b"path", b"a.json")]) + pax([(b"path", b"b.json")]) + entry(
        b"c.json", GOOD) + END, False
    yield "pax-path-twice", pax([(b"path", b"a.json"), (b"path", b"b.json")]) + entry(
        b"c.json", GOOD) + END, False
    yield "global-pax-path", pax([(b"path", b"evil.json")], typeflag=b"g") + entry(
        b"good.json", GOOD) + END, False
    yield "global-pax-comment", pax([(b"comment", b"made by hand")], typeflag=b"g") + entry(
        b"good.json", GOOD) + END, True
    yield "pax-gnu-sparse-name", pax([(b"GNU.sparse.name", b"evil.json")]) + entry(
        b"good.json", GOOD) + END, False
    yield "pax-empty-path", pax([(b"path", b"")]) + entry(b"good.json", GOOD) + END, False
    yield "regular-file-named-with-slash", entry(b"a/", GOOD) + END, False
    yield "old-regular-type-named-with-slash", entry(b"a/", typeflag=b"\x00") + entry(
        b"a/b.json", GOOD) + END, False
    yield "gnu-long-link-name", longname(b"target", typeflag=b"K") + entry(
        b"good.json", GOOD) + END, False
    yield "pax-path-with-nul", pax([(b"path", b"good.json\x00evil")]) + entry(
        b"x.json", GOOD) + END, False
    yield "pax-path-utf8", pax([(b"path", "caf\u00e9.json".encode())]) + entry(
        b"x.json", GOOD) + END, None
    yield "pax-path-not-utf8", pax([(b"path", b"caf\xe9.json")]) + entry(
        b"x.json", GOOD) + END, None
    yield "oldgnu-sparse-type", entry(b"sparse.json", GOOD, typeflag=b"S",
                                      magic=b"ustar  \x00") + END, False
    yield "hard-link", entry(b"a.json", GOOD) + entry(b"b.json", typeflag=b"1",
                                                      link=b"a.json") + END, False
    yield "symbolic-link", entry(b"a.json", typeflag=b"2", link=b"/etc/passwd") + END, False
    yield "absolute-path", entry(b"/tmp/evil.json", EVIL) + END, False
    yield "dot-dot", entry(b"../evil.json", EVIL) + END, False
    yield "dot-dot-inside", entry(b"a/../b.json", EVIL) + END, False
    yield "dot-slash", entry(b"./a.json", GOOD) + END, True
    yield "duplicate-name", entry(b"a.json", GOOD) + entry(b"a.json", EVIL) + END, False
    yield "duplicate-after-cleaning", entry(b"a.json", GOOD) + entry(b"./a.json", EVIL) + END, False
    yield "directory-then-file-of-its-name", entry(b"a", typeflag=b"5") + entry(
        b"a", EVIL) + END, None
    yield "file-then-file-under-it", entry(b"a", GOOD) + entry(b"a/b.json", EVIL) + END, False
    yield "contiguous-type", entry(b"c.json", GOOD, typeflag=b"7") + END, True
    yield "nul-in-name-field", entry(b"good.json\x00/../evil", GOOD) + END, True


def made_by_tools(work):
    """Archives written by Python's tarfile and GNU tar in each of their formats."""
    src = os.path.join(work, "src")
    deep = os.path.join(src, "m", "d" * 60, "e" * 60)
    os.makedirs(deep)
    for path, data in ((os.path.join(deep, "w" * 80 + ".safetensors"), EVIL + GOOD),
                       (os.path.join(src, "m", "config.json"), GOOD)):
        with open(path, "wb") as f:
            f.write(data)
    for fmt, name in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"),
                      (tarfile.PAX_FORMAT, "pax")):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            tf.add(os.path.join(src, "m"), arcname="m")
        yield "python-" + name, buf.getvalue(), True
    for fmt in ("gnu", "oldgnu", "posix", "ustar"):
        out = os.path.join(work, "gnu-" + fmt + ".tar")
        subprocess.run(["tar", "--format=" + fmt, "-cf", out, "-C", src, "m"], check=True)
        with open(out, "rb") as f:
            yield "gnu-tar-" + fmt, f.read(), True


def files_under(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                rel = os.path.relpath(os.fsencode(p), os.fsencode(root))
                with open(p, "rb") as f:
                    out[rel.hex()] = hashlib.sha256(f.read()).hexdigest()
    return out


def gnu_tar(archive, work):
    out = tempfile.mkdtemp(dir=work)
    r = subprocess.run(["tar", "-xf", archive, "-C", out, "--no-same-owner",
                        "--no-same-permissions"], capture_output=True)
    return files_under(out) if r.returncode == 0 else None


def python_tarfile(archive):
    out = {}
    try:
        with tarfile.open(archive, "r:") as tf:
            for m in tf:
                if m.isreg():
                    name = os.path.normpath(os.fsencode(m.name))
                    out[name.hex()] = hashlib.sha256(tf.extractfile(m).read()).hexdigest()
    except (tarfile.TarError, ValueError, OSError):
        return None
    return out


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    cases = []
    with tempfile.TemporaryDirectory() as work:
        for name, data, must_accept in list(crafted()) + list(made_by_tools(work)):
            path = os.path.join(outdir, name + ".tar")
            with open(path, "wb") as f:
                f.write(data)
            cases.append({"name": name, "file": path, "must_accept": must_accept,
                          "gnu": gnu_tar(path, work), "python": python_tarfile(path)})
    with open(os.path.join(outdir, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)


if __name__ == "__main__":
    main()
