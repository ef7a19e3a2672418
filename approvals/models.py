"""Approval requests and decisions (see issue: approvals bound to digests)."""
