"""The admin area (issue 39): accounts, running turns, the global model connection and the server's health.

`model_connection` (the connection an admin sets in the browser, over the environment's), `service` (the
`AdminArea` the page and the routes use), `routes` (`/api/admin`, admins only). It may import `broker` and
everything below it (the contracts in pyproject.toml); within `core` only `services` and `routes` import it.
"""

from core.admin.model_connection import ModelConnectionAdmin
from core.admin.service import AdminArea

__all__ = ["AdminArea", "ModelConnectionAdmin"]
