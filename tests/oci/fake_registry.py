#!/usr/bin/env python3
"""A small fake OCI registry for tests/oci (docs/interop.md, "OCI registries").

Serves what a JSON config names, on 127.0.0.1 (an ephemeral port, printed as "PORT <n>" on
stdout once listening), with behaviours a real registry does not show on demand:
  manifests   {ref: {"path": file, "media_type": type}}   by tag or digest
  blobs       {digest: file}                               served under that digest as they are
  token       {"user", "password", "token"}: /v2/ answers 401 with a Bearer challenge whose
              realm is this server's /token, which issues `token` for Basic user:password
  reject_token  true: 401 even with the issued token
  redirect_blobs  true: blob GETs answer 307 to a second listener (a different origin), which
              answers 400 when the request carries an Authorization header
  status      {"blobs" or "manifests": code}: answer that code (e.g. 429 with Retry-After: 7)
Every request line and whether it carried Authorization is appended to `log` (a file).
"""
import base64
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

cfg = json.load(open(sys.argv[1]))
state = {"storage_port": 0, "port": 0}


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
        log("registry %s %s auth=%s" % (self.command, self.path, auth or "no"))
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
        m = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", self.path)
        if not m or m.group(1) != cfg["repo"]:
            self.send_error(404)
            return
        kind, ref = m.group(2), m.group(3)
        code = cfg.get("status", {}).get(kind)
        if code:
            self.send_response(code)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if kind == "manifests":
            entry = cfg["manifests"].get(ref)
            if not entry:
                self.send_error(404)
                return
            send_bytes(self, open(entry["path"], "rb").read(), entry["media_type"])
            return
        if ref not in cfg["blobs"]:
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


def main():
    storage = ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    state["storage_port"] = storage.server_address[1]
    threading.Thread(target=storage.serve_forever, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    state["port"] = server.server_address[1]
    print("PORT %d" % state["port"], flush=True)
    server.serve_forever()


main()
