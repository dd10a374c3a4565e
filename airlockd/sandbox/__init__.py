"""The container runtime behind a Protocol: `Sandbox` (base), `DockerSandbox` (docker), the image.

Callers depend on `Sandbox` and `ContainerSpec`; only `docker.py` and `image.py` touch the engine.
"""

from airlockd.sandbox.base import ContainerSpec, ExitInfo, Sandbox

__all__ = ["ContainerSpec", "ExitInfo", "Sandbox"]
