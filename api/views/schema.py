"""``GET /api/schema/``: the OpenAPI document, generated once per process and then served as built.

Generating walks every view and serializer through drf-spectacular, which keeps its working state
(the component registry, the view being inspected) where concurrent generations share it: two
first requests generating at once answered 500. Under the lock the first request builds the
document and every request waiting there serves what it built. The document is the same for every
caller (``SERVE_PUBLIC``: not filtered by who asks), and the task types it names are registered
when the process starts, so building it once per process is all it needs.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response


class SchemaApi(SpectacularAPIView):
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _built: ClassVar[dict[str | None, Any]] = {}  # the document per API version

    # SpectacularAPIView's helpers carry no annotations: their calls are marked no-untyped-call.
    def _get_schema_response(self, request: Request) -> Response:
        version = self.api_version or request.version or self._get_version_parameter(request)  # type: ignore[no-untyped-call]
        with self._lock:
            if version not in self._built:
                self._built[version] = super()._get_schema_response(request).data  # type: ignore[no-untyped-call]
        filename = self._get_filename(request, version)  # type: ignore[no-untyped-call]
        return Response(
            data=self._built[version], headers={"Content-Disposition": f'inline; filename="{filename}"'}
        )
