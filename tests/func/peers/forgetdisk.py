"""The test disk that forgets what was not flushed (tests/powercut/forgetdisk.c), driven
from a test: mount it, cut the power (now, or at the N-th flush), bring it back keeping
some or none of the unflushed changes, inject errors.

The disk runs in the foreground as a child of the test and mounts itself again after
each restore, once the test has unmounted it (which drops the kernel's caches, as a
reboot would).  Everything is loopback-free: the disk is a directory of the test's.
"""

import os
import pathlib
import subprocess
import time

FORGETDISK = os.environ.get("FORGETDISK")
SYNCFS_BRIDGE = os.environ.get("SYNCFS_BRIDGE")
NOSYNC = os.environ.get("NOSYNC")


def unavailable():
    """Why the disk cannot be used here, or None."""
    if not FORGETDISK or not os.path.exists(FORGETDISK):
        return "forgetdisk not built (libfuse3-dev missing at configure time)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if os.geteuid() != 0:
        return "mounting the test disk needs root"
    return None


class ForgetDisk:
    def __init__(self, mountpoint):
        self.mnt = pathlib.Path(mountpoint)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.proc = None
        self.log = self.mnt.parent / f"{self.mnt.name}.log"

    def start(self):
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen([FORGETDISK, str(self.mnt)], stdin=subprocess.DEVNULL,
                                     stdout=self._out, stderr=subprocess.STDOUT)
        self._wait_mounted()
        return self

    def _wait_mounted(self, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"forgetdisk exited {self.proc.returncode}: "
                                     f"{self.log.read_text(errors='replace')[-2000:]}")
            if os.path.ismount(self.mnt):
                try:
                    self.stats()
                    return
                except OSError:
                    pass
            time.sleep(0.01)
        raise AssertionError(f"forgetdisk did not mount {self.mnt} within {timeout}s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            subprocess.run(["umount", str(self.mnt)], capture_output=True)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        if getattr(self, "_out", None):
            self._out.close()
            self._out = None

    # commands ----------------------------------------------------------------------------
    def _set(self, name, value):
        os.setxattr(self.mnt, f"user.forget.{name}", value.encode())

    def stats(self):
        text = os.getxattr(self.mnt, "user.forget.stats").decode()
        out = {}
        for part in text.split():
            k, v = part.split("=", 1)
            out[k] = v if k == "state" else int(v)
        return out

    def victim(self, pid):
        """The process the cut kills (SIGKILL, before the request that cut is answered)."""
        self._set("victim", str(pid))

    def cut_now(self):
        self._set("cut", "now")

    def cut_at_flush(self, n, after=False):
        """Lose power at the n-th flush from now, before it is done (or just after)."""
        self._set("cut", f"flush {n}{' after' if after else ''}")

    def cancel_cut(self):
        self._set("cut", "off")

    def is_off(self):
        return self.stats()["state"] == "off"

    def restore(self, seed, p):
        """Power back, keeping each unflushed change with probability p; then unmount
        and wait for the disk to mount itself again."""
        self._set("restore", f"{seed} {p}")
        for _ in range(100):
            r = subprocess.run(["umount", str(self.mnt)], capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.05)   # EBUSY: a dying process's files are still being closed
        else:
            raise AssertionError(f"cannot unmount the test disk: {r.stderr}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.path.ismount(self.mnt):
                try:
                    if self.stats()["state"] == "on":
                        return
                except OSError:
                    pass
            time.sleep(0.01)
        raise AssertionError("the test disk did not mount again after the restore")

    def fail(self, op, err, count=1, skip=0):
        """The next `count` requests of `op` (write, fsync, fsyncdir, syncfs, rename,
        create, link, unlink), after `skip` more, fail with `err` (EIO, ENOSPC...)."""
        self._set("fail", f"{op} {err} {count} {skip}")

    def fail_off(self):
        self._set("fail", "off")
