"""python -m app serve --host 127.0.0.1 --port 8000

One process serves the product on the embedded default: the widget demo at /, the support-chat
API at /api/chat, the help-centre articles at /kb, and the engine's OpenAI-compatible routes
under /inference (e.g. /inference/v1/chat/completions), all sharing one in-process engine
(unless INFERENCE_URL points at a separate inference service).
"""
from __future__ import annotations

import argparse
import logging
import sys


def serve(args: argparse.Namespace) -> int:
    import waitress
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from app import create_app
    from app.settings import WebSettings
    from pipelines.inference_client import InProcessClient
    from pipelines.resilience import client_from_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = WebSettings()
    client = client_from_env(settings.redis_url)
    web = create_app(client=client, settings=settings)
    mounts = {}
    primary = client.endpoints[0].client
    if isinstance(primary, InProcessClient):            # the embedded default serves OpenAI routes too
        from inference.server.app import ServerConfig
        from inference.server.app import create_app as create_inference_app
        mounts["/inference"] = create_inference_app(lambda: primary.engine,
                                                    ServerConfig(served_model_name=primary.model))
    from httpkit.shutdown import GracefulShutdown
    app = GracefulShutdown(DispatcherMiddleware(web, mounts), settings.shutdown_drain_s,
                           on_exit=client.close)
    app.install()                                # SIGTERM: refuse new requests, finish streams, exit
    services = web.extensions["support_chat"]["services"]
    services.start()   # /readyz turns 200
    base = f"http://{args.host}:{args.port}"
    print(f"Support chat demo:   {base}/\nChat API:            {base}/api/chat  (X-Site-Key: demo-site-key)\n"
          + (f"OpenAI-compatible:   {base}/inference/v1  (model {primary.model})\n" if mounts else
             f"Inference service:   {settings.inference_url}\n"), flush=True)
    waitress.serve(app, host=args.host, port=args.port, threads=args.threads, send_bytes=1,
                   channel_request_lookahead=1, connection_limit=args.connection_limit or settings.web_connection_limit,
                   channel_timeout=300,
                   asyncore_use_poll=True,                 # select() stops at 1024 descriptors
                   ident="support-app")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="serve the web app (and the in-process engine)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, default=64)
    # connections are cheap in waitress's event loop (a thread is held only while a request runs):
    # accept many, and let CHAT_MAX_TURNS answer 503 past what the threads can serve, instead of
    # leaving connections unaccepted in the kernel's backlog until the client times out
    p.add_argument("--connection-limit", type=int, default=None,
                   help="default: WEB_CONNECTION_LIMIT (2000)")
    h = sub.add_parser("hash-key", help="print the tenants.yaml entry (sha256:...) for an API key")
    h.add_argument("key")
    args = parser.parse_args(argv)
    if args.cmd == "hash-key":
        from app.tenants import hash_api_key
        print(hash_api_key(args.key))
        return 0
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
