"""A small stateful HTTP service of the kind agents start while they work.

It keeps a hit counter and a running total in memory and appends one line
per request to server.log. The benchmark's recovery check reads the
in-memory state from outside the sandbox without making the process run:
the state is mirrored into a fixed buffer whose address is written to
/var/tmp/memprobe/<pid> as "ADDRESS LENGTH".
"""
import ctypes
import http.server
import os
import sys

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
BUF_LEN = 64
buf = ctypes.create_string_buffer(BUF_LEN)
hits = 0
total = 0
items = []


def publish():
    s = b"hits=%d total=%d items=%d" % (hits, total, len(items))
    ctypes.memset(buf, 0, BUF_LEN)
    ctypes.memmove(buf, s, len(s))


publish()
os.makedirs("/var/tmp/memprobe", exist_ok=True)
with open("/var/tmp/memprobe/%d" % os.getpid(), "w") as f:
    f.write("%d %d\n" % (ctypes.addressof(buf), BUF_LEN))
log = open("server.log", "a")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits, total
        hits += 1
        parts = self.path.strip("/").split("/")
        if parts[0] == "add" and len(parts) == 2:
            total += int(parts[1])
        elif parts[0] == "push" and len(parts) == 2:
            items.append(parts[1])
        elif parts[0] == "pop" and items:
            items.pop()
        publish()
        body = ("hits=%d total=%d items=%s\n" % (hits, total, ",".join(items))).encode()
        log.write("%s -> hits=%d total=%d\n" % (self.path, hits, total))
        log.flush()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
