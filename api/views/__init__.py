"""The API's views: one ``APIView`` per operation, in ``tasks`` and ``approvals``."""
