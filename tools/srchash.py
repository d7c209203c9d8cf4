"""Print a short hash of everything a chapter's output depends on besides the chapter itself.

jupyter-cache re-executes a notebook only when its code cells change; the Makefile wipes _build
whenever this hash changes, so an edit in src/ never leaves a stale page behind.
"""

import hashlib
import pathlib

root = pathlib.Path(__file__).resolve().parent.parent
files = ["requirements.txt", "pyproject.toml", *sorted(
    str(p.relative_to(root)) for p in (root / "src").rglob("*.py"))]
digest = hashlib.sha256()
for name in files:
    digest.update(name.encode() + b"\0" + (root / name).read_bytes())
print(digest.hexdigest()[:16])
