"""Wait until no process holds dpkg's locks (apt, unattended-upgrades at first boot), then exit 0.

apt and dpkg take fcntl (POSIX) locks on these files, which flock(1) does not see: this takes and releases the
same kind of lock. Usage: wait-dpkg-lock.py SECONDS. Prints how long it waited and how old apt's package lists are
(lists_age_s=, as apt's `cache_valid_time` reads it: the periodic update's success stamp, else the lists
directory); exits 1 after SECONDS."""

import fcntl
import os
import sys
import time

LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")
#: What ansible.builtin.apt compares with cache_valid_time, in its order.
LISTS_UPDATED = ("/var/lib/apt/periodic/update-success-stamp", "/var/lib/apt/lists")


def main() -> int:
    deadline = time.monotonic() + float(sys.argv[1])
    started = time.monotonic()
    for path in LOCKS:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # absent or unopenable: nothing can hold it against us
        try:
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.lockf(fd, fcntl.LOCK_UN)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        print(f"{path} still held after {sys.argv[1]}s", file=sys.stderr)
                        return 1
                    time.sleep(2)
        finally:
            os.close(fd)
    print(f"waited {time.monotonic() - started:.0f}s")
    updated = next((os.stat(path).st_mtime for path in LISTS_UPDATED if os.path.exists(path)), None)
    if updated is not None:
        print(f"lists_age_s={max(0, int(time.time() - updated))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
