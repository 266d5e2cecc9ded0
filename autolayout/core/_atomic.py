"""Files written whole: a temporary file in the same directory, then ``os.replace``, so a
reader polling the file sees the old text or the new, never half of one, and a process
killed while writing leaves the old file as it was."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def atomic_write(path: str | Path, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` atomically; returns the path. The file keeps its
    permissions where it exists (else the umask's); a symbolic link's target is written.

    Example:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
      >>> atomic_write(p, "{}").read_text()
      '{}'
    """
    p = Path(path)
    real = Path(os.path.realpath(p))
    tmp = real.with_name(f".{real.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if real.exists():
            os.chmod(tmp, stat.S_IMODE(real.stat().st_mode))
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
