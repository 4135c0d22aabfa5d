"""An app on another origin than Runledger: a tiny HTTP server in a thread that serves one plain page
(other_origin.html: `call` and `follow`, which speak to Runledger with fetch), or the files it is
given — a built app, as a dev server would serve it — and nothing else.

    with OtherOrigin() as app:
        page.goto(app.url("127.0.0.1"))   # origin http://127.0.0.1:PORT
        page.goto(app.url("localhost"))   # the same page, another origin: http://localhost:PORT

    with OtherOrigin({"/": index_html, "/dist/app.js": bundle}) as app:
        app.files["/config.json"] = b'{...}'   # served from the next request on
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

PAGE = (Path(__file__).parent / "other_origin.html").read_bytes()
TYPES = {".js": "text/javascript", ".json": "application/json"}


class _Server(ThreadingHTTPServer):
    files: dict[str, bytes]


class _Page(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = urlsplit(self.path).path  # a query (`/?run=…`) is the page's own
        body = self.server.files.get(path)
        self.send_response(404 if body is None else 200)
        self.send_header("Content-Type", TYPES.get(Path(path).suffix, "text/html") + "; charset=utf-8")
        self.send_header("Content-Length", str(0 if body is None else len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body is not None:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OtherOrigin:
    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.server = _Server(("127.0.0.1", 0), _Page)
        self.files = self.server.files = {"/": PAGE} if files is None else files
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def origin(self, host: str) -> str:
        return f"http://{host}:{self.port}"

    def url(self, host: str) -> str:
        return self.origin(host) + "/"

    def __enter__(self) -> "OtherOrigin":
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
