"""TCP → unix-socket relay, run *inside* a sandbox that has no network.

Usage: ``python3 relay.py PORT SOCKET_PATH [-- CMD ARGS...]``

Listens on ``127.0.0.1:PORT``, forwards every connection to the unix socket ``SOCKET_PATH`` (the
serving proxy, bind-mounted from the host), then runs ``CMD`` as a child and exits with its exit
code (128+N when a signal N killed it, 127 when it cannot be found, 126 when it cannot be run).
Without ``CMD`` (server mode: once per sandbox, see ``bwrap/relay.py`` and the Docker launcher) it
writes ``ready`` and a newline on its stdout once it listens, then relays until it is killed.

Invariants: the listener is bound and listening before ``CMD`` starts; every relayed TCP connection
has ``TCP_NODELAY`` (no delayed-ACK stall on multi-piece responses); the relay never outlives the
command; SIGTERM/SIGINT/SIGHUP are forwarded to it. Standard library only, and only its C-level
modules (``_socket``, ``_thread``, ``_signal``, ``os``, ``sys``): ``socket``, ``signal`` and
``threading`` pull in ``enum``, ``selectors`` and more, which cost more start-up time than the rest of
the relay, and where the sandbox cannot hold one relay for all its commands (bwrap as a non-root user)
it starts once per sandboxed command. It runs under whatever Python the sandbox has,
one thread per connection direction.
"""

import _signal  # type: ignore[import-not-found]  # typeshed has no stub for the C module under signal
import _socket
import _thread
import os
import sys

_CHUNK = 65536


def _pipe(src: "_socket.socket", dst: "_socket.socket", done: "_thread.LockType | None" = None) -> None:
    """Copy ``src`` to ``dst`` until EOF or an error, then half-close ``dst`` (and release ``done``)."""
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
        if done is not None:
            done.release()


def _nodelay(sock: "_socket.socket") -> None:
    """No Nagle on the TCP side: a response relayed in several pieces must not wait ~40 ms for the
    client's delayed ACK before its last piece goes out."""
    try:
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _handle(fd: int, sock_path: str) -> None:
    client = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
    _nodelay(client)
    up = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        up.connect(sock_path)
    except OSError:
        up.close()
        client.close()
        return
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(_pipe, (up, client, done))
    _pipe(client, up)
    done.acquire()  # the other direction finished
    client.close()
    up.close()


def _serve(listener: "_socket.socket", sock_path: str) -> None:
    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]  # the C socket's own accept: no stub
        except OSError:
            return
        _thread.start_new_thread(_handle, (fd, sock_path))


def _listen(port: int) -> "_socket.socket":
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    _nodelay(listener)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    return listener


def _run(cmd: list) -> int:
    try:
        pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    except FileNotFoundError:
        print(f"relay: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    except OSError as e:
        print(f"relay: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 126
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, lambda s, _f: os.kill(pid, s))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main(argv: list) -> int:
    """``relay.py PORT SOCKET_PATH [-- CMD...]``: relay 127.0.0.1:PORT to the socket; with CMD, run it and
    exit with its code (the relay ends with it), else relay until killed."""
    if len(argv) < 2:
        print("usage: relay.py PORT SOCKET_PATH [-- CMD ARGS...]", file=sys.stderr)
        return 2
    port, sock_path = int(argv[0]), argv[1]
    cmd = argv[3:] if len(argv) > 2 and argv[2] == "--" else argv[2:]
    if not os.path.exists(sock_path):
        print(f"relay: proxy socket {sock_path} does not exist", file=sys.stderr)
        return 2
    listener = _listen(port)
    if not cmd:
        try:
            os.write(1, b"ready\n")  # a sandbox holding one relay waits for this line before its first exec
        except OSError:
            pass
        _serve(listener, sock_path)
        return 0
    _thread.start_new_thread(_serve, (listener, sock_path))
    return _run(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
