"""The model egress gateway (a Unix socket per run) and the run tokens it checks."""

from airlockd.gateway.server import Gateway, Route
from airlockd.gateway.tokens import RunTokens, TokenRefused

__all__ = ["Gateway", "Route", "RunTokens", "TokenRefused"]
