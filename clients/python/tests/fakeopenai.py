"""A scripted OpenAI-compatible chat endpoint (no model): POST
/v1/chat/completions answers with script(request_body) -> message dict
(or an int: that HTTP status). requests holds (headers, body) of each call."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, script):
        self.script = script
        self.requests = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n))
                with lock:
                    outer.requests.append((dict(self.headers), body))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                msg = outer.script(body)
                if isinstance(msg, int):
                    self.send_response(msg)
                    self.end_headers()
                    self.wfile.write(b'{"error": "scripted failure"}')
                    return
                out = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                                  "choices": [{"index": 0, "message": dict(msg, role="assistant"),
                                               "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/v1" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def call(name, args, i=0, raw=None):
    """One tool call of an assistant message."""
    return {"id": "call_%s_%d" % (name, i), "type": "function",
            "function": {"name": name, "arguments": raw if raw is not None else json.dumps(args)}}
