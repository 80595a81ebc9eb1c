"""TCP → unix-socket relay, run *inside* a sandbox that has no network.

Usage: ``python3 relay.py PORT SOCKET_PATH -- CMD ARGS...``

Listens on ``127.0.0.1:PORT``, forwards every connection to the unix socket ``SOCKET_PATH`` (the
serving proxy, bind-mounted from the host), then runs ``CMD`` as a child and exits with its exit
code (128+N when a signal N killed it, 127 when it cannot be found, 126 when it cannot be run).

Invariants: the listener is bound and listening before ``CMD`` starts; the relay never outlives the
command; SIGTERM/SIGINT/SIGHUP are forwarded to it. Standard library only, and no ``asyncio``
(its import alone costs more than the rest of the relay's start-up): it runs under whatever Python
the sandbox has, one thread per connection direction.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF or an error, then half-close ``dst``."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _handle(client: socket.socket, sock_path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(sock_path)
    except OSError:
        up.close()
        client.close()
        return
    back = threading.Thread(target=_pipe, args=(up, client), daemon=True)
    back.start()
    _pipe(client, up)
    back.join()
    client.close()
    up.close()


def _serve(listener: socket.socket, sock_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_handle, args=(client, sock_path), daemon=True).start()


def _run(cmd: list[str]) -> int:
    try:
        pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    except FileNotFoundError:
        print(f"relay: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    except OSError as e:
        print(f"relay: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 126
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: relay.py PORT SOCKET_PATH [-- CMD ARGS...]", file=sys.stderr)
        return 2
    port, sock_path = int(argv[0]), argv[1]
    cmd = argv[3:] if len(argv) > 2 and argv[2] == "--" else argv[2:]
    if not os.path.exists(sock_path):
        print(f"relay: proxy socket {sock_path} does not exist", file=sys.stderr)
        return 2
    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    if not cmd:
        _serve(listener, sock_path)
        return 0
    threading.Thread(target=_serve, args=(listener, sock_path), daemon=True).start()
    return _run(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
