"""TCP → unix-socket relay, run *inside* a sandbox that has no network.

Usage: ``python3 relay.py PORT SOCKET_PATH -- CMD ARGS...``

Listens on ``127.0.0.1:PORT``, forwards every connection to the unix socket ``SOCKET_PATH`` (the
serving proxy, bind-mounted from the host), then runs ``CMD`` as a child and exits with its exit
code; the relay never outlives the command. Standard library only: it runs under whatever Python
the sandbox has.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()


async def _handle(sock_path: str, client_r, client_w) -> None:
    try:
        up_r, up_w = await asyncio.open_unix_connection(sock_path)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
    for w in (client_w, up_w):
        w.close()


async def _main(port: int, sock_path: str, cmd: list[str]) -> int:
    server = await asyncio.start_server(lambda r, w: _handle(sock_path, r, w), "127.0.0.1", port)
    if not cmd:
        async with server:
            await server.serve_forever()
        return 0
    proc = await asyncio.create_subprocess_exec(*cmd)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: proc.send_signal(s))
    code = await proc.wait()
    server.close()
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
    return asyncio.run(_main(port, sock_path, cmd))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
