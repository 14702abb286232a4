#!/usr/bin/env python3
"""A small fake OCI registry for tests/oci (docs/interop.md, "OCI registries").

Serves what a JSON config names, on 127.0.0.1 (an ephemeral port, printed as "PORT <n>" on
stdout once listening), with behaviours a real registry does not show on demand:
  manifests   {ref: {"path": file, "media_type": type, "digest_header"?: digest}}   by tag or
              digest; with digest_header, answered with that Docker-Content-Digest
  blobs       {digest: file}                               served under that digest as they are
  token       {"user", "password", "token", "refresh"}: /v2/ answers 401 with a Bearer challenge
              whose realm is this server's /token, which issues `token` for Basic user:password
              (GET), or for the OAuth2 grant_type=refresh_token with `refresh` (POST)
  reject_token  true: 401 even with the issued token
  redirect_blobs  true: blob GETs answer 307 to a second listener (a different origin), which
              answers 400 when the request carries an Authorization header
  status      {"blobs" or "manifests": code}: answer that code (e.g. 429 with Retry-After: 7)
  writable    true: blob uploads (POST then PUT ?digest=) and manifest PUTs are kept in memory
              and served like the configured ones; DELETE of a manifest forgets it
  lose_index_writes  N (with writable): answer the first N PUTs of a `sha256-...` tag with 201
              but keep nothing, as if a concurrent writer had overwritten them at once
  fail_tag_reads  N (with writable): answer the first N GETs of a `sha256-...` tag with 500, as
              Debian's docker-registry does for a GET that meets a concurrent write of the tag
  blob_in_flux  N (with writable): answer the first N PUTs of a manifest by digest 400
              DIGEST_INVALID + MANIFEST_BLOB_UNKNOWN and forget its config blob, as Debian's
              docker-registry answers while another push of that blob rewrites its link
  referrers_api  true (with writable): the OCI 1.1 referrers API: a manifest PUT with a
              `subject` answers OCI-Subject, and GET /v2/REPO/referrers/DIGEST answers an image
              index of the manifests whose subject is DIGEST; without it that path is 404
  range_answer  how blob Range requests are answered instead of as asked: "ignore" (200 and the
              whole blob), "other_range" (206 with the range one byte later, labelled so),
              "short" (206 with one byte less than asked, labelled so)
Every request line, whether it carried Authorization and its Range header are appended to `log`
(a file).
"""
import base64
import hashlib
import json
import re
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

cfg = json.load(open(sys.argv[1]))
state = {"storage_port": 0, "port": 0}
pushed = {"blobs": {}, "manifests": {}}  # digest or tag -> (bytes, media type)
lock = threading.Lock()
lost = {"index_writes": 0, "tag_reads": 0, "blob_in_flux": 0}


def log(line):
    if cfg.get("log"):
        with open(cfg["log"], "a") as f:
            f.write(line + "\n")


def send_bytes(h, data, content_type="application/octet-stream", extra=None):
    rng = h.headers.get("Range")
    total = len(data)
    status = 200
    headers = {"Content-Type": content_type}
    if rng:
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
        a, b = int(m.group(1)), int(m.group(2))
        if a >= total:
            h.send_response(416)
            h.send_header("Content-Range", "bytes */%d" % total)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        b = min(b, total - 1)
        how = cfg.get("range_answer")
        if how == "other_range" and b + 1 < total:
            a, b = a + 1, b + 1
        elif how == "short" and b > a:
            b -= 1
        if how != "ignore":
            data = data[a:b + 1]
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (a, b, total)
    h.send_response(status)
    for k, v in {**headers, **(extra or {})}.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(data)


class Storage(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        auth = self.headers.get("Authorization")
        log("storage %s %s auth=%s" % (self.command, self.path, "yes" if auth else "no"))
        if auth:
            self.send_error(400, "authorization forwarded to storage")
            return
        digest = self.path.rsplit("/", 1)[-1]
        send_bytes(self, open(cfg["blobs"][digest], "rb").read())


class Registry(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes

    def log_message(self, *a):
        pass

    def authorized(self):
        tok = cfg.get("token")
        if not tok:
            return True
        if self.headers.get("Authorization") == "Bearer " + tok["token"] and not cfg.get(
                "reject_token"):
            return True
        self.send_response(401)
        self.send_header(
            "WWW-Authenticate",
            'Bearer realm="http://127.0.0.1:%d/token",service="fake",scope="repository:%s:pull"'
            % (state["port"], cfg["repo"]))
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_GET(self):
        auth = self.headers.get("Authorization")
        rng = self.headers.get("Range")
        log("registry %s %s auth=%s%s" % (self.command, self.path, auth or "no",
                                          " range=" + rng if rng else ""))
        if self.path.startswith("/token"):
            tok = cfg["token"]
            want = "Basic " + base64.b64encode(
                ("%s:%s" % (tok["user"], tok["password"])).encode()).decode()
            if auth != want:
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps({"token": tok["token"]}).encode()
            send_bytes(self, body, "application/json")
            return
        if not self.authorized():
            return
        m = re.fullmatch(r"/v2/(.+)/referrers/(sha256:[0-9a-f]{64})", self.path)
        if m and cfg.get("referrers_api") and m.group(1) == cfg["repo"]:
            self.send_referrers(m.group(2))
            return
        m = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", self.path)
        if not m or m.group(1) != cfg["repo"]:
            self.send_error(404)
            return
        kind, ref = m.group(2), m.group(3)
        code = cfg.get("status", {}).get(kind)
        if kind == "manifests" and ref.startswith("sha256-"):
            with lock:
                if lost["tag_reads"] < cfg.get("fail_tag_reads", 0):
                    lost["tag_reads"] += 1
                    code = 500
        if code:
            self.send_response(code)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with lock:
            kept = pushed[kind].get(ref)
        if kept:
            send_bytes(self, kept[0], kept[1], {"Docker-Content-Digest": digest_of(kept[0])})
            return
        if kind == "manifests":
            entry = cfg.get("manifests", {}).get(ref)
            if not entry:
                self.send_error(404)
                return
            extra = ({"Docker-Content-Digest": entry["digest_header"]}
                     if "digest_header" in entry else None)
            send_bytes(self, open(entry["path"], "rb").read(), entry["media_type"], extra)
            return
        if ref not in cfg.get("blobs", {}):
            self.send_error(404)
            return
        if cfg.get("redirect_blobs"):
            self.send_response(307)
            self.send_header("Location", "http://localhost:%d/storage/%s" %
                             (state["storage_port"], ref))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        send_bytes(self, open(cfg["blobs"][ref], "rb").read())


    def do_HEAD(self):
        log("registry HEAD %s" % self.path)
        if not self.authorized():
            return
        m = re.fullmatch(r"/v2/(.+)/blobs/(sha256:[0-9a-f]{64})", self.path)
        with lock:
            kept = m and m.group(1) == cfg["repo"] and (
                m.group(2) in pushed["blobs"] or m.group(2) in cfg.get("blobs", {}))
        self.answer(200 if kept else 404)

    def send_referrers(self, digest):
        entries = []
        with lock:
            for ref, (data, media_type) in pushed["manifests"].items():
                if not ref.startswith("sha256:"):
                    continue
                m = json.loads(data)
                if m.get("subject", {}).get("digest") != digest:
                    continue
                d = {"mediaType": media_type, "digest": ref, "size": len(data)}
                if "artifactType" in m:
                    d["artifactType"] = m["artifactType"]
                entries.append(d)
        body = json.dumps({"schemaVersion": 2, "mediaType":
                           "application/vnd.oci.image.index.v1+json", "manifests": entries})
        send_bytes(self, body.encode(), "application/vnd.oci.image.index.v1+json")

    def oauth_token(self, data):
        """The OAuth2 refresh-token grant: `token.refresh` buys `token.token`."""
        form = urllib.parse.parse_qs(data.decode())
        tok = cfg.get("token", {})
        log("registry POST /token form=%s" % ",".join(sorted(form)))
        ok = (form.get("grant_type") == ["refresh_token"] and tok.get("refresh") and
              form.get("refresh_token") == [tok["refresh"]] and form.get("client_id") and
              form.get("service") == ["fake"])
        if not ok:
            return self.answer(401)
        send_bytes(self, json.dumps({"access_token": tok["token"], "expires_in": 60,
                                     "scope": form.get("scope", [""])[0]}).encode(),
                   "application/json")

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def answer(self, code, headers=None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        log("registry POST %s" % self.path)
        data = self.body()
        if self.path.startswith("/token"):
            return self.oauth_token(data)
        if not cfg.get("writable"):
            return self.answer(405)
        if not self.authorized():
            return
        self.answer(202, {"Location": "/v2/%s/blobs/uploads/u%d" % (cfg["repo"], len(data))})

    def do_PUT(self):
        log("registry PUT %s" % self.path)
        data = self.body()
        if not cfg.get("writable"):
            return self.answer(405)
        if not self.authorized():
            return
        m = re.fullmatch(r"/v2/(.+)/blobs/uploads/[^?]+\?digest=(sha256%3A|sha256:)([0-9a-f]{64})",
                         self.path)
        if m:
            digest = "sha256:" + m.group(3)
            if digest_of(data) != digest:
                return self.answer(400)
            with lock:
                pushed["blobs"][digest] = (data, "application/octet-stream")
            return self.answer(201, {"Docker-Content-Digest": digest})
        m = re.fullmatch(r"/v2/(.+)/manifests/([^/]+)", self.path)
        if not m or m.group(1) != cfg["repo"]:
            return self.answer(404)
        digest = digest_of(data)
        media_type = self.headers.get("Content-Type", "")
        doc = json.loads(data)
        config = doc.get("config", {}).get("digest") if isinstance(doc, dict) else None
        with lock:
            in_flux = (m.group(2) == digest and config in pushed["blobs"] and
                       lost["blob_in_flux"] < cfg.get("blob_in_flux", 0))
            if in_flux:
                lost["blob_in_flux"] += 1
                del pushed["blobs"][config]
        if in_flux:
            body = json.dumps({"errors": [
                {"code": "DIGEST_INVALID",
                 "message": "provided digest did not match uploaded content"},
                {"code": "MANIFEST_BLOB_UNKNOWN", "message": "blob unknown to registry",
                 "detail": config}]}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if m.group(2).startswith("sha256-") and lost["index_writes"] < cfg.get(
                "lose_index_writes", 0):
            lost["index_writes"] += 1
            return self.answer(201, {"Docker-Content-Digest": digest})
        with lock:
            pushed["manifests"][m.group(2)] = (data, media_type)
            pushed["manifests"][digest] = (data, media_type)
        headers = {"Docker-Content-Digest": digest}
        subject = doc.get("subject") if isinstance(doc, dict) else None
        if cfg.get("referrers_api") and subject:
            headers["OCI-Subject"] = subject["digest"]
        self.answer(201, headers)

    def do_DELETE(self):
        log("registry DELETE %s" % self.path)
        m = re.fullmatch(r"/v2/(.+)/manifests/(sha256:[0-9a-f]{64})", self.path)
        with lock:
            gone = m and pushed["manifests"].pop(m.group(2), None)
        self.answer(202 if gone else 404)


def digest_of(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    storage = ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    state["storage_port"] = storage.server_address[1]
    threading.Thread(target=storage.serve_forever, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    state["port"] = server.server_address[1]
    print("PORT %d" % state["port"], flush=True)
    server.serve_forever()


main()
