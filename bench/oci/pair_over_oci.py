#!/usr/bin/env python3
"""The fixture pair audited over oci:// against the same files on disk (docs/PERFORMANCE.md,
"OCI registries").

Usage: bench/oci/pair_over_oci.py BUILD_DIR [RUNS]

Serves tests/data/mini-kimi-nvfp4 and tests/data/mini-kimi-mxfp4 as ModelPack artifacts of raw
layers from tests/oci/fake_registry.py (which logs every request) and, when it is installed,
from Debian's docker-registry (pushed with plain HTTP here); runs `ckpt-audit audit ROOT
--source SOURCE` over oci:// and on disk RUNS times each, and prints the best wall time of each
and the number of HTTP requests one audit made to the fake registry (by kind).
"""
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = ["mini-kimi-nvfp4", "mini-kimi-mxfp4"]


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def artifact(fixture):
    """(blobs {digest: bytes}, manifest bytes) of `fixture` as raw ModelPack layers."""
    blobs, layers = {}, []
    folder = os.path.join(SRC, "tests", "data", fixture)
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        blobs[digest(data)] = data
        kind = "weight" if name.endswith(".safetensors") else "weight.config"
        layers.append({"mediaType": "application/vnd.cncf.model.%s.v1.raw" % kind,
                       "digest": digest(data), "size": len(data),
                       "annotations": {"org.cncf.model.filepath": name}})
    config = json.dumps({"descriptor": {"name": fixture}}).encode()
    blobs[digest(config)] = config
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.cncf.model.manifest.v1+json",
        "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                   "digest": digest(config), "size": len(config)},
        "layers": layers}).encode()
    return blobs, manifest


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def audit(cli, work, root, source, env):
    start = time.monotonic()
    r = subprocess.run([cli, "audit", "--json", "--db", os.path.join(work, "log.db"), "--key",
                        os.path.join(work, "key.pem"), root, "--source", source],
                       env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if r.returncode != 0:
        sys.exit("audit of %s failed (%d): %s" % (root, r.returncode, r.stderr))
    return wall, json.loads(r.stdout)["verdict"]


def main():
    build, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    cli = os.path.join(build, "services", "cli", "ckpt-audit")
    work = tempfile.mkdtemp(prefix="pair-over-oci-")
    env = dict(os.environ, DOCKER_CONFIG=work, XDG_DATA_HOME=os.path.join(work, "xdg"))
    subprocess.run([cli, "keys", "generate", "--out", os.path.join(work, "key.pem"), "--trust",
                    os.path.join(work, "trusted")], env=env, check=True, capture_output=True)
    arts = {f: artifact(f) for f in FIXTURES}
    results = []
    disk = [os.path.join(SRC, "tests", "data", f) for f in FIXTURES]
    results.append(("disk", min(audit(cli, work, *disk, env)[0] for _ in range(runs)), None))

    # The fake registry: blobs from files, every request logged.
    cfg = {"repo": "m", "manifests": {}, "blobs": {}, "log": os.path.join(work, "requests.log")}
    refs = []
    for f, (blobs, manifest) in arts.items():
        for d, data in blobs.items():
            path = os.path.join(work, d[7:])
            open(path, "wb").write(data)
            cfg["blobs"][d] = path
        path = os.path.join(work, digest(manifest)[7:] + ".manifest")
        open(path, "wb").write(manifest)
        cfg["manifests"][digest(manifest)] = {
            "path": path, "media_type": "application/vnd.oci.image.manifest.v1+json"}
        refs.append(digest(manifest))
    open(os.path.join(work, "fake.json"), "w").write(json.dumps(cfg))
    fake = subprocess.Popen([sys.executable, os.path.join(SRC, "tests", "oci", "fake_registry.py"),
                             os.path.join(work, "fake.json")], stdout=subprocess.PIPE, text=True)
    host = "127.0.0.1:%s" % fake.stdout.readline().split()[1]
    oci = ["oci://%s/m@%s" % (host, d) for d in refs]
    best = None
    for _ in range(runs):
        if os.path.exists(cfg["log"]):
            os.remove(cfg["log"])
        wall, _ = audit(cli, work, *oci, env)
        best = wall if best is None else min(best, wall)
    fake.terminate()
    fake.wait()
    log = open(cfg["log"]).read().splitlines()
    kinds = {k: sum(1 for line in log if "/%s/" % k in line) for k in ("manifests", "blobs")}
    results.append(("fake registry (python)", best, (len(log), kinds)))

    if shutil.which("docker-registry"):
        port = free_port()
        conf = os.path.join(work, "registry.yml")
        open(conf, "w").write("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: "
                              "true\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  "
                              "addr: 127.0.0.1:%d\n" % (os.path.join(work, "storage"), port))
        reg = subprocess.Popen(["docker-registry", "serve", conf], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        base = "http://127.0.0.1:%d/v2/m/" % port
        for _ in range(100):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/v2/" % port)
                break
            except OSError:
                time.sleep(0.1)
        for blobs, manifest in arts.values():
            for d, data in blobs.items():
                r = urllib.request.urlopen(urllib.request.Request(base + "blobs/uploads/",
                                                                  method="POST"))
                loc = r.headers["Location"]
                loc += ("&" if "?" in loc else "?") + "digest=" + d
                urllib.request.urlopen(urllib.request.Request(
                    loc if loc.startswith("http") else "http://127.0.0.1:%d%s" % (port, loc),
                    data=data, method="PUT",
                    headers={"Content-Type": "application/octet-stream"}))
            urllib.request.urlopen(urllib.request.Request(
                base + "manifests/" + digest(manifest), data=manifest, method="PUT",
                headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}))
        oci = ["oci://127.0.0.1:%d/m@%s" % (port, d) for d in refs]
        best = min(audit(cli, work, *oci, env)[0] for _ in range(runs))
        reg.terminate()
        reg.wait()
        results.append(("docker-registry 2.8", best, None))
    for what, wall, requests in results:
        line = "%-24s best of %d: %.3f s" % (what, runs, wall)
        if requests:
            line += "; requests per audit: %d (%s)" % (
                requests[0], ", ".join("%s %d" % kv for kv in requests[1].items()))
        print(line)
    if not os.environ.get("KEEP"):
        shutil.rmtree(work)
    else:
        print(work)


main()
