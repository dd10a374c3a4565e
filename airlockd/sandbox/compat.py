"""The runtime image's gVisor compatibility library (runtime/compat/gvisor-compat.c), built with
the host's C compiler when the image's top layer is built, and preloaded into every dynamically
linked program of the image through /etc/ld.so.preload.

Without it, bookworm's `ls`, `stat`, `cp -a` ... fail on every path under runsc (its kernel
refuses the AT_NO_AUTOMOUNT flag they pass); an agent that cannot list a directory cannot work.
The library drops that one flag, which means nothing in a container (no automount points), so
the same image serves runc and runsc.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from airlockd.errors import AirlockError

SOURCE = "compat/gvisor-compat.c"
IN_IMAGE = "usr/lib/airlockd/gvisor-compat.so"
PRELOAD = "etc/ld.so.preload"
_FLAGS = ["-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-nostartfiles", "-s"]


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build(runtime_root: Path) -> bytes | None:
    """The compiled library for `runtime_root`'s source; None when the definition has none.
    Raises AirlockError, with the fix, when there is no C compiler or the build fails."""
    src = runtime_root / SOURCE
    if not src.is_file():
        return None
    cc = compiler()
    if cc is None:
        raise AirlockError(
            "building the runtime image needs a C compiler for its gVisor compatibility library "
            f"({src.name}), and none is installed",
            hint="apt-get install gcc libc6-dev (make image does it), then build again",
        )
    with tempfile.TemporaryDirectory(prefix="airlockd-compat-") as tmp:
        out = Path(tmp) / "compat.so"
        proc = subprocess.run([cc, *_FLAGS, "-o", str(out), str(src)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[:5]
            raise AirlockError(
                f"compiling {src} failed: {' / '.join(detail) or f'exit {proc.returncode}'}",
                hint="check the C compiler (apt-get install gcc libc6-dev)",
            )
        return out.read_bytes()
