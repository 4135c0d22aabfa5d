"""An app on another origin than Runledger: a tiny HTTP server in a thread that serves one plain page
(other_origin.html: `call` and `follow`, which speak to Runledger with fetch) and nothing else.

    with OtherOrigin() as app:
        page.goto(app.url("127.0.0.1"))   # origin http://127.0.0.1:PORT
        page.goto(app.url("localhost"))   # the same page, another origin: http://localhost:PORT
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

PAGE = (Path(__file__).parent / "other_origin.html").read_bytes()


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == "/"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE) if found else 0))
        self.end_headers()
        if found:
            self.wfile.write(PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OtherOrigin:
    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
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
