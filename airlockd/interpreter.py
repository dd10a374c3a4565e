"""How airlockd starts a Python process of its own (a run's carrier, the daemon, a walk, the cold
build's packer): this interpreter, `-m` its module, and never the current directory on the path.

`python -m module` puts the current directory first on `sys.path`, ahead of site-packages. The
CLI's workspace defaults to the current directory, and editors start the daemon in the
workspace folder, so a workspace that ships an `airlockd/` package of its own would have it
imported by every child, as the user, before anything was staged or screened (the attack review
ran its code as root through the packer). `-P` (Python 3.11+, which airlockd requires) leaves
the current directory out and keeps `PYTHONPATH`, which the user set.
"""

from __future__ import annotations

import sys


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args...` with this interpreter, safely."""
    return [sys.executable, "-P", "-m", module, *args]
