"""A small JSON client for the Kubernetes API, used by the process kubelet.

The kubelet reads and writes raw objects (camelCase dicts) and needs only a handful of verbs;
one instance per thread, since each holds its own connection pool.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
import yaml

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer; ``status`` is the HTTP code."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:500]}")
        self.status = status


class KubeApi:
    """Bearer-token client for one API server."""

    def __init__(self, server: str, token: str, ca_path: str) -> None:
        self.server = server
        self.token = token
        self.ca_path = ca_path
        self._http = httpx.Client(
            base_url=server,
            verify=ssl.create_default_context(cafile=ca_path),
            headers={"Authorization": f"Bearer {token}"},
            timeout=10.0,
        )

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeApi:
        config = yaml.safe_load(path.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        return cls(cluster["server"], user["token"], cluster["certificate-authority"])

    def clone(self) -> KubeApi:
        """A client with its own connection pool, for another thread."""
        return KubeApi(self.server, self.token, self.ca_path)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Obj:
        response = self._http.request(method, path, json=body, **kwargs)
        if response.status_code >= 300:
            raise ApiError(response.status_code, response.text)
        result: Obj = response.json() if response.content else {}
        return result

    def get(self, path: str, params: dict[str, str] | None = None) -> Obj:
        return self._call("GET", path, params=params)

    def post(self, path: str, body: Obj) -> Obj:
        return self._call("POST", path, body)

    def put(self, path: str, body: Obj) -> Obj:
        return self._call("PUT", path, body)

    def patch(self, path: str, body: Obj, content_type: str = STRATEGIC) -> Obj:
        return self._call("PATCH", path, body, headers={"Content-Type": content_type})

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self._call("DELETE", path, body)
