"""Real loopback HTTP servers in a thread, for tests of code that calls HTTP endpoints: a WSGI app
(werkzeug's threaded server) and one that answers only after a delay (time-outs)."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from werkzeug.serving import make_server


@contextlib.contextmanager
def serving_wsgi(app) -> Iterator[str]:
    """The app on a free 127.0.0.1 port; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


@contextlib.contextmanager
def slow_server(delay_s: float) -> Iterator[tuple[str, list[str]]]:
    """Answers every request `{}` after `delay_s`; yields (base URL, the paths it was asked for)."""
    seen: list[str] = []

    class Slow(BaseHTTPRequestHandler):
        def _answer(self):
            seen.append(self.path)
            time.sleep(delay_s)
            with contextlib.suppress(OSError):           # the client gave up first
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        thread.join(timeout=5)
