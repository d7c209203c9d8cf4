"""Find a Chromium for the browser test, or install one where this machine allows it.

    python3 tools/find_browser.py            print the browser's path; exit 1 if there is none
    python3 tools/find_browser.py --install  the same, but first try to install one if none is found

Looked for, in order: the CHROMIUM environment variable, a Chromium or Chrome on PATH, and a
browser that Playwright's own installer downloaded (~/.cache/ms-playwright). Installed, in order:
Debian's `chromium` package when run as root on a machine with apt-get, then Playwright's
installer (`npx playwright install chromium`) where the network reaches its download server.
When nothing works, one line on stderr says what to install, and the exit status is 1.

Standard library only: `make test` runs this before it creates the virtual environment, so that a
machine without a browser stops in its first seconds instead of after the whole test suite.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
PLAYWRIGHT_CACHE = {
    "linux": "~/.cache/ms-playwright",
    "darwin": "~/Library/Caches/ms-playwright",
}
PLAYWRIGHT_BINARIES = (  # inside <cache>/chromium-<revision>/
    "chrome-linux*/chrome",
    "chrome-mac*/Chromium.app/Contents/MacOS/Chromium",
    "chrome-mac*/Google Chrome for Testing.app/Contents/MacOS/Google Chrome for Testing",
)
HOW_TO = ("no Chromium found for the browser test: install one (Debian/Ubuntu: `sudo apt-get "
          "install chromium`; anywhere with internet: `npx playwright install chromium`) or set "
          "CHROMIUM=/path/to/chrome")


def find() -> str | None:
    """The path of a usable Chromium, or None."""
    given = os.environ.get("CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    cache = os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or PLAYWRIGHT_CACHE.get(sys.platform, "")
    if cache:
        root = pathlib.Path(cache).expanduser()
        for pattern in PLAYWRIGHT_BINARIES:
            found = sorted(glob.glob(str(root / "chromium-*" / pattern)))
            if found:
                return found[-1]  # the newest revision
    return None


def _run(cmd: list[str], timeout: int) -> bool:
    print("installing a browser:", " ".join(cmd), file=sys.stderr)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        return subprocess.run(cmd, timeout=timeout, stdout=subprocess.DEVNULL, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def install() -> None:
    """Try Debian's package (as root), then Playwright's installer; quietly give up otherwise."""
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        updated = _run(["apt-get", "update", "-qq"], timeout=300)
        if updated and _run(["apt-get", "install", "-y", "-qq", "chromium"], timeout=900):
            return
    if shutil.which("npx"):
        _run(["npx", "--yes", "playwright", "install", "chromium"], timeout=900)


def main(argv: list[str]) -> int:
    if os.environ.get("CHROMIUM") and not find():
        print(f"CHROMIUM={os.environ['CHROMIUM']} is not an executable file", file=sys.stderr)
        return 1
    path = find()
    if path is None and "--install" in argv:
        install()
        path = find()
    if path is None:
        print(HOW_TO, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
