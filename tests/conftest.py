"""Shared fixtures.  Every test runs under pytest-trio (``trio_mode = true``)."""

from __future__ import annotations
