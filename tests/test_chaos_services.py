"""The fault campaign's own services (chaos/services.py), where they can be tried alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from chaos.services import remove_faketime_leftovers


def test_libfaketimes_leftovers_of_gone_processes_are_removed(tmp_path):
    """A process killed under libfaketime leaves its two files in /dev/shm: those of a gone
    process made since the campaign started are removed; a live process's, older ones and
    anything else are left."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone_pid, live_pid = int(gone.stdout), os.getpid()
    since = time.time() - 60
    names = {f"faketime_shm_{gone_pid}", f"sem.faketime_sem_{gone_pid}",
             f"faketime_shm_{live_pid}", f"sem.faketime_sem_{live_pid}", "faketime_shm_old",
             "other"}
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    old = tmp_path / f"faketime_shm_{gone_pid + 1}"
    old.write_bytes(b"x")
    os.utime(old, (since - 3600, since - 3600))

    removed = remove_faketime_leftovers(since, shm_dir=tmp_path)

    assert sorted(removed) == sorted([f"faketime_shm_{gone_pid}", f"sem.faketime_sem_{gone_pid}"])
    assert {p.name for p in tmp_path.iterdir()} == (
        names - set(removed)) | {old.name}
