"""An OpenAI-compatible HTTP endpoint over the policy's engine, for agent programs written against the
OpenAI client: `GET /v1/models` and `POST /v1/chat/completions` (tools, no streaming).

Each trajectory is a session with its own base URL (`http://127.0.0.1:PORT/<session>/v1`), so an
unmodified agent only needs the base URL; every call of a session goes through its `Recorder`, which
turns the calls into token-exact training rows. Requests of all sessions are served concurrently, one
thread each, and meet in one `GenerationQueue` that batches them onto the engine."""
from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from upslope.agents.chat_render import ChatRenderer
from upslope.agents.engine_queue import GenerationQueue
from upslope.agents.openai_api import (RequestError, completion_body, error_body, models_body, parse_request,
                                       reply_message, tool_calls)
from upslope.agents.recorder import LimitReached, Recorder
from upslope.engine import SamplingParams


class _HTTPServer(ThreadingHTTPServer):
    """A thread per request, and a listen backlog for many agents connecting at once (the default, 5,
    refused connections when 64 programs started together)."""

    daemon_threads = True
    request_queue_size = 1024


@dataclass
class Session:
    """One trajectory's endpoint: its recorder and the sampling settings of its calls."""

    key: str
    base_url: str
    recorder: Recorder
    params: SamplingParams
    errors: list[str] = field(default_factory=list)  # calls refused or failed (not limits), one line each


class PolicyServer:
    """The HTTP server: sessions opened and closed by the rollout, requests served on their own threads.

    model_name: the id `/v1/models` lists (requests may name any model; the policy answers them all)."""

    def __init__(self, queue: GenerationQueue, renderer: ChatRenderer, tool_format: Any, *, model_name: str = "policy",
                 host: str = "127.0.0.1", port: int = 0):
        self.queue, self.renderer, self.tool_format = queue, renderer, tool_format
        self.model_name = model_name
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.httpd = _HTTPServer((host, port), _handler(self))
        self.host, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="upslope-policy-server", daemon=True)
        self._thread.start()

    def open(self, recorder: Recorder, params: SamplingParams) -> Session:
        key = uuid.uuid4().hex[:12]
        session = Session(key, f"http://{self.host}:{self.port}/{key}/v1", recorder, params)
        with self._lock:
            self.sessions[key] = session
        return session

    def close_session(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.key, None)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "PolicyServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def session(self, key: str) -> Session:
        with self._lock:
            found = self.sessions.get(key)
        if found is None:
            raise RequestError(f"no open session {key!r} (a trajectory's base URL is valid while it runs)", 404,
                               "not_found")
        return found

    def chat(self, session: Session, body: Any) -> dict[str, Any]:
        """Answer one chat-completions request of `session` (RequestError / LimitReached when refused)."""
        req = parse_request(body)
        try:
            call = session.recorder.prepare(req.messages, req.tools or None, req.prefill, req.max_tokens)
        except LimitReached:
            raise
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        except Exception as exc:  # a template that fails on these messages
            raise RequestError(f"the chat template failed on these messages ({type(exc).__name__}: {exc})") from None
        params = session.params
        comp = self.queue.generate(call.prompt, replace(params, n=1, max_new_tokens=call.max_tokens))
        toks = list(comp.token_ids)[:call.max_tokens]
        stops = set(params.stop_token_ids)
        ended = bool(toks) and toks[-1] in stops
        text = self.renderer.reply_text(toks[:-1] if ended else toks)
        calls = tool_calls(text, self.tool_format) if req.tools and req.parse_tools else []
        message = reply_message(text, calls)
        session.recorder.record(call, comp, params.stop_token_ids, message)
        finish = "tool_calls" if calls else ("stop" if ended else "length")
        lps = None
        if req.logprobs:
            lps = [(self.renderer.decode([t]), float(lp)) for t, lp in zip(toks, comp.logprobs)]
        return completion_body(message, model=req.model or self.model_name, finish_reason=finish,
                               prompt_ids=call.prompt, reply_ids=toks, token_logprobs=lps, token_ids=req.token_ids)


def _handler(server: PolicyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the OpenAI client reuses its connections

        def log_message(self, format: str, *args: Any) -> None:  # no access log on the run's output
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str, str]:
            """(session key, endpoint after /v1) of the path `/<key>/v1/<endpoint>`."""
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) < 3 or parts[1] != "v1":
                raise RequestError(f"unknown path {self.path!r}; the base URL is http://host:port/<session>/v1", 404,
                                   "not_found")
            return parts[0], "/".join(parts[2:])

        def do_GET(self) -> None:
            try:
                key, endpoint = self._route()
                server.session(key)
                if endpoint != "models":
                    raise RequestError(f"unknown endpoint GET /v1/{endpoint}", 404, "not_found")
                self._send(200, models_body(server.model_name))
            except RequestError as exc:
                self._send(exc.status, error_body(str(exc), exc.code))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            session = None
            try:
                key, endpoint = self._route()
                session = server.session(key)
                if endpoint != "chat/completions":
                    raise RequestError(f"unknown endpoint POST /v1/{endpoint} (served: chat/completions)", 404,
                                       "not_found")
                try:
                    body = json.loads(raw or b"null")
                except json.JSONDecodeError as exc:
                    raise RequestError(f"the request body is not JSON ({exc.msg})") from None
                self._send(200, server.chat(session, body))
            except LimitReached as exc:
                self._send(400, error_body(str(exc), exc.code))
            except RequestError as exc:
                if session is not None:
                    session.errors.append(f"refused a request: {exc}")
                self._send(exc.status, error_body(str(exc), exc.code))
            except Exception as exc:  # the engine failed: the agent gets a server error, the rollout sees it too
                if session is not None:
                    session.errors.append(f"failed: {type(exc).__name__}: {exc}")
                self._send(500, error_body(f"{type(exc).__name__}: {exc}", "server_error"))

    return Handler
