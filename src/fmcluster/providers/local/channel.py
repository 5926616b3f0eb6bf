"""Session Manager's channel, stood in on the local substrate: run inside an instance's own network namespace
(`ip netns exec`), it connects to the instance's sshd and carries ssh's bytes over stdin/stdout, as the SSM
agent on an instance forwards an `AWS-StartSSHSession` session to its port 22.

    channel.py HOST PORT

Run as a script by path (ssh's ProxyCommand), standard library only: no fmcluster import per connection.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

CHUNK = 65536


def _to_socket(sock: socket.socket) -> None:
    while data := os.read(0, CHUNK):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: channel.py HOST PORT", file=sys.stderr)
        return 2
    try:
        sock = socket.create_connection((argv[0], int(argv[1])), timeout=10)
    except (OSError, ValueError) as err:
        print(f"session channel: cannot reach {argv[0]}:{argv[1]} inside the instance: {err}", file=sys.stderr)
        return 1
    sock.settimeout(None)
    threading.Thread(target=_to_socket, args=(sock,), daemon=True).start()
    while data := sock.recv(CHUNK):
        os.write(1, data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
