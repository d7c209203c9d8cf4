"""The widget versions Colab has, in a throwaway environment over .venv.

    .venv/bin/python tools/colab_env.py create          make it (if needed); print its python

Colab's front end renders ipywidgets 7 only, and Colab ships ipywidgets 7.7.1 (unchanged since
2022). The environment made here, ``.venv/colab``, holds exactly the packages of ``COLAB_OVERLAY``
at Colab's versions and sees everything else through ``.venv`` (a ``.pth`` file adds .venv's
site-packages *after* its own), so Colab's ipywidgets shadows the 8.x that the static book needs.
It costs a few seconds, not a second PyTorch.

tests/test_colab.py uses it: pip's install there adds nothing but the package, and an explorer
built there is driven the way a reader's kernel on Colab would (tests/harness.py's ``drive``).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import sysconfig
import venv

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASE = ROOT / ".venv"
HOME = BASE / "colab"
PYTHON = HOME / "bin" / "python"

# What Colab has, from googlecolab/backend-info (pip-freeze.gpu.txt at a724079, 2026-08-19):
# every package the book's library asks for, at Colab's version. tests/test_colab.py checks that
# pyproject.toml's requirements admit each of them, so pip's default strategy keeps them all.
COLAB_FREEZE = {
    "torch": "2.11.0",
    "einops": "0.8.2",
    "matplotlib": "3.10.0",
    "seaborn": "0.13.2",
    "ipywidgets": "7.7.1",
    "tqdm": "4.67.3",
    "numpy": "2.1.3",
    "safetensors": "0.8.0",
    "tokenizers": "0.22.2",
    "huggingface-hub": "1.27.0",
}
# ... and the ones installed into .venv/colab to shadow .venv's (the widget stack; ipywidgets 7
# imports ipython_genutils, which Colab also has).
COLAB_OVERLAY = {
    "ipywidgets": "7.7.1",
    "widgetsnbextension": "3.6.10",
    "ipython_genutils": "0.2.0",
}


def _site_packages(prefix: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(sysconfig.get_path("purelib", vars={"base": str(prefix),
                                                             "platbase": str(prefix)}))


def create() -> pathlib.Path:
    """Make .venv/colab if it is missing or older than this file or .venv; return its python."""
    stamp, base_stamp = HOME / ".installed", BASE / ".installed"
    if not base_stamp.exists():
        sys.exit("no .venv: run `make test` (or `make book`) first, it creates .venv")
    newest = max(pathlib.Path(__file__).stat().st_mtime, base_stamp.stat().st_mtime)
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        return PYTHON
    shutil.rmtree(HOME, ignore_errors=True)
    # no pip of its own: `python -m pip` finds .venv's pip, and no old setuptools shadows .venv's
    venv.EnvBuilder(with_pip=False).create(HOME)
    own = _site_packages(HOME)
    base = _site_packages(BASE)
    (own / "zz_selfattn_base.pth").write_text(f"import site; site.addsitedir({str(base)!r})\n")
    pins = [f"{name}=={version}" for name, version in COLAB_OVERLAY.items()]
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", *pins], check=True)
    stamp.touch()
    return PYTHON


if __name__ == "__main__":
    command, *rest = sys.argv[1:] or ["create"]
    if command == "create":
        print(create())
    else:
        sys.exit(f"unknown command {command!r}: use create")
