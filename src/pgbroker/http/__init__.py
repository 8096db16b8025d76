"""pgbroker's HTTP face: a Starlette application (``create_app``) with the REST API, API-key
authentication, Prometheus ``/metrics`` and a dashboard; ``pgbroker serve`` runs it with uvicorn."""

from pgbroker.http.app import create_app
from pgbroker.http.settings import Settings

__all__ = ["Settings", "create_app"]
