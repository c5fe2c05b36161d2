#!/usr/bin/env python3
"""A fault-injecting TCP proxy on loopback, between a daemon and the S3 server.

    s3-fault-proxy.py LISTEN_PORT TARGET_PORT MODE_FILE

Each new connection reads MODE_FILE (one word) and behaves accordingly:
  pass   forward bytes both ways
  reset  close the connection at once (connection reset / refused-like)
  503    read the request head, answer "503 SlowDown" (an S3 error body), close
  stall  accept and read, never answer (the client's timeouts must fire)
When the mode changes, every open connection of another mode is closed (a client's
kept-alive connection would otherwise carry on as before). Prints
"ready" once listening. Counts connections per mode in MODE_FILE.count.
"""
import os
import socket
import sys
import threading

listen_port, target_port, mode_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
counts = {}
lock = threading.Lock()
stalled = []
passing = []


def mode():
    try:
        with open(mode_file) as f:
            return f.read().strip() or "pass"
    except OSError:
        return "pass"


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(conn):
    m = mode()
    with lock:
        counts[m] = counts.get(m, 0) + 1
        with open(mode_file + ".count", "w") as f:
            f.write(" ".join(f"{k}={v}" for k, v in sorted(counts.items())) + "\n")
    if m == "reset":
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()
        return
    if m == "503":
        conn.settimeout(5)
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                head += chunk
            body = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>'
            conn.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        except OSError:
            pass
        conn.close()
        return
    if m == "stall":
        with lock:
            stalled.append(conn)
        return
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port))
    except OSError:
        conn.close()
        return
    with lock:
        passing.append(conn)
    threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()
    threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()


def close_all(conns):
    for c in conns:
        try:
            c.shutdown(socket.SHUT_RDWR)
            c.close()
        except OSError:
            pass
    conns.clear()


def release_on_change():
    while True:
        threading.Event().wait(0.1)
        m = mode()
        with lock:
            if m != "stall":
                close_all(stalled)
            if m != "pass":
                close_all(passing)


server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", listen_port))
server.listen(64)
threading.Thread(target=release_on_change, daemon=True).start()
print("ready", flush=True)
while True:
    c, _ = server.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
